//! `cuinterpose run` and `cuinterpose inspect` (issue 3) with the real binary on the fake driver.

mod common;

use common::*;
use serde_json::Value;

#[test]
fn run_execs_the_command_in_place_with_the_shim_first_in_ld_preload() {
    let env = env();
    let control = env.dir().join("ctl-run");
    let socket = env.socket_dir().join("run.sock");
    let workload = env.artifacts().workload().unwrap();
    let shim = std::fs::canonicalize(env.artifacts().shim().unwrap()).unwrap();
    // Something already preloaded must stay, after the shim.
    let other = std::fs::canonicalize(env.artifacts().dir().join("libcuda.so")).unwrap();
    let mut cmd = env.command(&tool_path(&env), false).unwrap();
    cmd.env("LD_PRELOAD", &other)
        .arg("run")
        .arg("--control-dir")
        .arg(&control)
        .arg("--")
        .arg(&workload)
        .arg("serve")
        .arg("--listen")
        .arg(&socket);
    let started = spawn_owned(&env, cmd, "run");
    let pid = started.0.id();
    testkit::wire::wait_listening(&socket, testkit::harness::START_TIMEOUT, || alive(pid))
        .unwrap_or_else(|e| {
            panic!(
                "the workload under `cuinterpose run` did not start: {e}\n{}",
                read(&env.log_dir().join("run.log"))
            )
        });
    let w = testkit::Workload::attach("run", socket, 0, env.log_dir().join("run.log")).unwrap();

    // Exec, not fork: the process the test started is the workload, its parent is the test.
    assert_eq!(
        w.pid(),
        pid,
        "the workload is not the process the test started"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(),
        std::fs::canonicalize(&workload).unwrap(),
        "pid {pid} is not the workload binary (a lingering cuinterpose?)"
    );
    let status = read(std::path::Path::new(&format!("/proc/{pid}/status")));
    let ppid = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .map(|v| v.trim().parse::<u32>().unwrap());
    assert_eq!(ppid, Some(std::process::id()), "parent of the workload");

    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let var = |name: &str| {
        environ
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(format!("{name}=").as_bytes()))
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    assert_eq!(
        var("LD_PRELOAD"),
        Some(format!("{}:{}", shim.display(), other.display())),
        "LD_PRELOAD: the shim first, then what was preloaded before"
    );
    assert_eq!(
        var("CUINTERPOSE_CONTROL_DIR"),
        Some(control.display().to_string())
    );
    let info = w.ok("info").unwrap();
    assert_eq!(info.data.get("shim"), Some(&Value::Bool(true)), "{info:?}");
    // The shim serves its control socket in --control-dir.
    let own = control.join(format!("cuinterpose-{}-{pid}.sock", pid_namespace(pid)));
    assert!(own.exists(), "{} missing", own.display());

    let report = tool(&env, &["inspect", "--pid", &pid.to_string(), "--json"]);
    let report = report.ok().json();
    let processes = report["processes"].as_array().unwrap();
    assert_eq!(processes.len(), 1, "{report:#}");
    assert_eq!(processes[0]["status"], "cuda+shim", "{report:#}");
    assert_eq!(
        processes[0]["info"]["control_socket"],
        format!("/proc/{pid}/root{}", own.display()),
        "{report:#}"
    );
}

/// A tree of `n` ranks under `cuinterpose run`, sharing in a ring (rank i creates `a<i>` and
/// exports it to rank i+1); with 4 ranks rank 0's `b0` is also imported by ranks 2 and 3, by
/// rank 3 only in part.
fn inspect_group(n: usize) {
    let env = env();
    let tree = Tree::run_tree(&env, n);
    let w = |r: usize| tree.w(&format!("r{r}"));
    for i in 0..n {
        create_shared(w(i), &format!("a{i}"), SIZE);
    }
    for i in 0..n {
        share(w(i), w((i + 1) % n), &format!("a{i}"), SIZE);
    }
    if n == 4 {
        create_shared(w(0), "b0", 2 * SIZE);
        share(w(0), w(2), "b0", 2 * SIZE);
        ok(
            w(0),
            &[&format!("send-fd b0 --to {}", w(3).socket().display())],
        );
        ok(
            w(3),
            &[
                &format!("import b0 --size {}", 2 * SIZE),
                &format!("reserve r-b0 {SIZE}"),
                &format!("map b0 r-b0 --alloc-offset {SIZE} --size {SIZE}"),
                "set-access b0 --device 0",
            ],
        );
    }
    let root = tree.root();
    assert_eq!(root, w(0).pid(), "rank 0 is the root under `run`");

    let run = tool(&env, &["inspect", "--pid", &root.to_string(), "--json"]);
    let report = run.ok().json();
    let ctx = || format!("{report:#}");
    let processes = report["processes"].as_array().unwrap();
    for r in 0..n {
        let p = processes
            .iter()
            .find(|p| p["info"]["host_pid"] == w(r).pid())
            .unwrap_or_else(|| panic!("rank {r} (pid {}) not found\n{}", w(r).pid(), ctx()));
        assert_eq!(p["status"], "cuda+shim", "rank {r}\n{}", ctx());
    }
    assert_eq!(report["refusals"].as_array().unwrap().len(), 0, "{}", ctx());
    let shared = report["shared"].as_array().unwrap();
    assert_eq!(shared.len(), n + usize::from(n == 4), "{}", ctx());

    // Every shared allocation: its creator, its importers, every mapping with its address.
    // (name, creator pid, importer pids, size, mappings as inspect shows them)
    type Expected = (String, u32, Vec<u32>, u64, Vec<String>);
    let mut expected: Vec<Expected> = Vec::new();
    for i in 0..n {
        let name = format!("a{i}");
        let next = (i + 1) % n;
        let maps = vec![
            mapping(w(i).pid(), &regions(w(i))[&name]),
            mapping(w(next).pid(), &regions(w(next))[&name]),
        ];
        expected.push((name, w(i).pid(), vec![w(next).pid()], SIZE, maps));
    }
    if n == 4 {
        let upper = &regions(w(3))["b0"];
        assert_eq!(upper.size, SIZE, "rank 3 maps half of b0");
        let maps = vec![
            mapping(w(0).pid(), &regions(w(0))["b0"]),
            mapping(w(2).pid(), &regions(w(2))["b0"]),
            mapping(w(3).pid(), upper),
        ];
        expected.push((
            "b0".into(),
            w(0).pid(),
            vec![w(2).pid(), w(3).pid()],
            2 * SIZE,
            maps,
        ));
    }
    let table = tool(&env, &["inspect", "--pid", &root.to_string()]);
    table.ok();
    assert!(
        table.stdout.contains("capture: possible"),
        "{}",
        table.describe()
    );
    for (name, creator, importers, size, maps) in expected {
        let entry = shared
            .iter()
            .find(|a| {
                let mut m: Vec<String> = a["mappings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect();
                m.sort();
                let mut want = maps.clone();
                want.sort();
                m == want
            })
            .unwrap_or_else(|| panic!("{name}: no allocation mapped at {maps:?}\n{}", ctx()));
        assert!(
            entry["creator"]
                .as_str()
                .unwrap()
                .starts_with(&label(creator)),
            "{name}: creator\n{}",
            ctx()
        );
        let got: Vec<&str> = entry["importers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(got.len(), importers.len(), "{name}: importers\n{}", ctx());
        for pid in importers {
            assert!(
                got.iter().any(|g| g.starts_with(&label(pid))),
                "{name}: importer pid {pid} missing\n{}",
                ctx()
            );
        }
        assert_eq!(entry["size"], size, "{name}: size\n{}", ctx());
        assert_eq!(entry["device"], 0, "{name}: device\n{}", ctx());
        // The table shows the same: the allocation's ID and every mapping.
        let id = entry["id"].as_str().unwrap();
        assert!(
            table.stdout.contains(id),
            "{name} ({id}) not in the table\n{}",
            table.stdout
        );
        for m in &maps {
            assert!(
                table.stdout.contains(&format!("mapped {m}")),
                "{name}: mapping {m} not in the table\n{}",
                table.stdout
            );
        }
    }
}

#[test]
fn inspect_shows_the_topology_of_a_two_process_group() {
    inspect_group(2);
}

#[test]
fn inspect_shows_the_topology_of_a_four_process_group() {
    inspect_group(4);
}

#[test]
fn inspect_names_the_cuda_processes_without_the_shim() {
    let env = env();
    let tree = Tree::launch(&env, &[Member::shim("with"), Member::plain("without")]);
    let without = tree.w("without").pid();
    let run = tool(
        &env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    );
    let report = run.ok().json();
    let status = |pid: u32| {
        report["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["info"]["host_pid"] == pid)
            .map(|p| p["status"].as_str().unwrap().to_string())
    };
    assert_eq!(
        status(tree.root()).as_deref(),
        Some("no cuda"),
        "{report:#}"
    );
    assert_eq!(
        status(tree.w("with").pid()).as_deref(),
        Some("cuda+shim"),
        "{report:#}"
    );
    assert_eq!(
        status(without).as_deref(),
        Some("cuda, no shim"),
        "{report:#}"
    );
    let refusals = report["refusals"].as_array().unwrap();
    assert_eq!(refusals.len(), 1, "{report:#}");
    assert!(
        refusals[0]["process"]
            .as_str()
            .unwrap()
            .starts_with(&label(without)),
        "{report:#}"
    );
    assert!(
        refusals[0]["reason"]
            .as_str()
            .unwrap()
            .contains("libcuinterpose.so"),
        "{report:#}"
    );
    let table = tool(&env, &["inspect", "--pid", &tree.root().to_string()]);
    assert!(
        table.ok().stdout.contains("capture: would be refused"),
        "{}",
        table.describe()
    );
}

#[test]
fn a_setting_that_does_not_parse_is_refused_with_exit_2_naming_it() {
    let env = env();
    let pid = std::process::id().to_string();
    for (name, value, says) in [
        (
            "CUINTERPOSE_ANSWER_TIMEOUT_MS",
            "ten",
            "is not a positive number of milliseconds",
        ),
        ("CUINTERPOSE_ANSWER_TIMEOUT_MS", "0", "positive"),
        ("CUINTERPOSE_LOG", "cuinterpose=loud", "is not a log filter"),
    ] {
        tool_with(&env, &["inspect", "--pid", &pid], &[(name, value)])
            .expect_code(2)
            .stderr_mentions(&[name, value, says]);
    }
}

#[test]
fn a_shim_setting_that_does_not_parse_is_logged_and_the_default_used() {
    let env = env();
    let tree = Tree::launch(
        &env,
        &[Member::shim("odd")
            .env("CUINTERPOSE_STAGING_CHUNK", "3K")
            .env("CUINTERPOSE_CARRIER", "mapped")],
    );
    // The runtime started (it answers) despite the two values it did not understand.
    let run = tool(
        &env,
        &["inspect", "--pid", &tree.root().to_string(), "--json"],
    );
    let report = run.ok().json();
    let status = report["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["info"]["host_pid"] == tree.w("odd").pid())
        .map(|p| p["status"].as_str().unwrap().to_string());
    assert_eq!(status.as_deref(), Some("cuda+shim"), "{report:#}");
    let log = read(&env.log_dir().join("odd.log"));
    for line in [
        "CUINTERPOSE_STAGING_CHUNK=\"3K\" is not a multiple of 4K from 256K to 64M; using 1M",
        "CUINTERPOSE_CARRIER=\"mapped\" is not auto, staged, registered or pinned; using auto",
    ] {
        assert!(log.contains(line), "{line:?} not in the log:\n{log}");
    }
}
