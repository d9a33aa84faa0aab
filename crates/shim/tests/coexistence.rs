//! The shim beside other code that uses the loader: a second `RTLD_NEXT` interposer, a library
//! looking symbols up in its own `RTLD_LOCAL` scope, an allocator interposer that calls `dlsym`
//! from inside `malloc`, and processes that never use CUDA. The driver here is
//! tests/c/odd_driver.c: these tests are about the loader, not about driver behaviour.

mod common;

use common::{Launch, SHIM_FILE, Work};

fn path_str(path: &std::path::Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn second_rtld_next_interposer_gets_the_next_symbol_in_either_order() {
    let work = Work::new();
    let driver = work.odd_driver_dir();
    let next = work.library("libnext.so", &["next.c"], &[]);
    let hello = work.program("hello", &["hello.c"], &["-L", path_str(&driver), "-lcuda"]);
    let base = Launch::new().library_path(&driver);

    let alone = base.clone().preload(&next).run(&hello).report();
    assert!(alone.line("next.cuMemCreate.next").is_driver());

    // Shim first: libnext's RTLD_NEXT lookups are relative to libnext, so `puts` is libc's and
    // `cuMemCreate` the driver's (a Rust-level forwarder would have made them relative to the
    // shim: libnext would get its own `puts` back and exit 3).
    let run = Launch {
        preload: vec![common::shim(), next.clone()],
        ..base.clone()
    }
    .run(&hello);
    assert!(run.stdout.contains("[libnext] hello"), "{run:#?}");
    let shim_first = run.report();
    assert!(
        shim_first.line("next.cuMemCreate.next").is_driver(),
        "{}",
        shim_first.run()
    );

    // libnext first: its next cuMemCreate is the shim's wrapper, which reaches the driver.
    let run = Launch {
        preload: vec![next.clone(), common::shim()],
        ..base.clone()
    }
    .run(&hello);
    assert!(run.stdout.contains("[libnext] hello"), "{run:#?}");
    let next_first = run.report();
    assert_eq!(next_first.line("next.cuMemCreate.next").provider, SHIM_FILE);

    for report in [&shim_first, &next_first] {
        assert_eq!(
            report.line("call.cuMemCreate.null_handle"),
            alone.line("call.cuMemCreate.null_handle")
        );
    }
}

#[test]
fn pseudo_handle_lookups_keep_the_callers_scope() {
    let work = Work::new();
    let dep = work.library("libscopedep.so", &["scopedep.c"], &[]);
    let dir = dep.parent().expect("dir").to_path_buf();
    let scope = work.library(
        "libscope.so",
        &["scope.c"],
        &["-L", path_str(&dir), "-lscopedep"],
    );
    let main = work.program("scope_main", &["scope_main.c"], &[]);
    let launch = Launch::new().library_path(&dir).arg(&scope);
    let with = launch.with_shim().run(&main).report();
    let without = launch.run(&main).report();
    // From the main program the RTLD_LOCAL library's dependency is invisible; from inside that
    // library, RTLD_DEFAULT and RTLD_NEXT see it. Both only hold if glibc sees the real caller.
    for label in ["main.default", "scope.default", "scope.next"] {
        assert_eq!(
            with.line(label),
            without.line(label),
            "{label}\n{}",
            with.run()
        );
    }
    assert_eq!(with.line("main.default").provider, "null");
    assert_eq!(with.line("scope.default").provider, "libscopedep.so");
    assert_eq!(with.line("scope.next").provider, "libscopedep.so");
}

#[test]
fn dlsym_hook_does_not_allocate() {
    let work = Work::new();
    let driver = work.odd_driver_dir();
    let spy = work.library("libmallocspy.so", &["mallocspy.c"], &[]);
    let dir = spy.parent().expect("dir").to_path_buf();
    let main = work.program(
        "spy_main",
        &["spy_main.c"],
        &["-L", path_str(&dir), "-lmallocspy"],
    );
    let launch = Launch::new().library_path(&dir).library_path(&driver);
    let with = launch.with_shim().run(&main).report();
    let without = launch.run(&main).report();

    // The spy's own bootstrap: its first malloc calls dlsym(RTLD_NEXT) four times, normally the
    // process's first dlsym calls, so the shim finds glibc's dlsym (dlvsym) right there.
    assert_eq!(
        with.line("spy.init").status,
        1,
        "the spy resolved its allocator"
    );
    assert_eq!(
        with.line("spy.init").result,
        0,
        "allocations inside dlsym during the spy's init"
    );
    // Explicit-handle lookups (substituted and not) and pseudo-handle lookups.
    assert_eq!(
        with.line("spy.lookups").result,
        0,
        "allocations inside dlsym lookups"
    );
    assert_eq!(
        without.line("spy.lookups").result,
        0,
        "baseline: glibc's dlsym"
    );
    assert_eq!(
        with.line("spy.cuMemCreate").provider,
        SHIM_FILE,
        "the explicit path really ran"
    );
    assert_eq!(with.line("spy.cuGetProcAddress_v2").provider, SHIM_FILE);
    assert!(with.line("spy.cuDriverGetVersion").is_driver());
    assert_eq!(
        with.line("spy.getpid.default"),
        without.line("spy.getpid.default")
    );
    assert_eq!(
        with.line("spy.getpid.next"),
        without.line("spy.getpid.next")
    );
}

#[test]
fn processes_without_cuda_are_left_alone() {
    let work = Work::new();
    let probe = work.program("nocuda", &["nocuda.c"], &[]);
    let control = work.control_dir();
    let launch = Launch::new().env("CUINTERPOSE_CONTROL_DIR", &control);
    let with = launch.with_shim().run(&probe);
    let without = launch.run(&probe);
    assert!(
        with.status.success() && without.status.success(),
        "{with:#?}"
    );
    // No thread started, no descriptor opened (the count includes what the test harness lets
    // children inherit, hence the comparison), the driver not loaded, nothing printed.
    assert_eq!(with.stdout, without.stdout);
    assert!(with.stdout.starts_with("threads=1 "), "{with:#?}");
    assert!(
        with.stdout.trim_end().ends_with(" driver_loaded=0"),
        "{with:#?}"
    );
    assert_eq!(with.stderr, "");
    assert_eq!(
        std::fs::read_dir(&control).expect("read_dir").count(),
        0,
        "no control socket"
    );

    let truth = Launch::new()
        .with_shim()
        .run(std::path::Path::new("/bin/true"));
    assert!(
        truth.status.success() && truth.stderr.is_empty(),
        "{truth:#?}"
    );
    let shell = Launch::new()
        .with_shim()
        .arg("-c")
        .arg("echo shell ok; /bin/true && echo child ok")
        .run(std::path::Path::new("/bin/sh"));
    assert!(shell.status.success(), "{shell:#?}");
    assert_eq!(shell.stdout, "shell ok\nchild ok\n");
    assert_eq!(shell.stderr, "");
}
