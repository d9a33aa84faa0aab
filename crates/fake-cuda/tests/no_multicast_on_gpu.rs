//! Multicast runs on the fake driver only: on the shared GPU machines a multicast object can take
//! GPUs out of service (docs/design.md, GPU rules). This test reads what the GPU lane runs and
//! fails if any of it can reach a multicast call on a real driver:
//!
//! - the lane scripts (`scripts/gpu-lane.sh`, `scripts/gpu/*.py`) name no multicast API (driver,
//!   runtime, PyTorch symmetric memory, NVSHMEM, NCCL window registration) and no multicast
//!   scenario or demo;
//! - every process they start keeps `NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`,
//!   `NVSHMEM_DISABLE_NVLS=1`: the lane exports them before it starts anything, every Python
//!   script imports `lane_common` (which sets them) at module level before torch, nothing sets
//!   them to another value, unsets them or starts a process with an environment of its own;
//! - the lane never passes `--allow-multicast`, the demo's explicit leave to make multicast
//!   objects, nor asks for `--sharing multicast`;
//! - the programs the lane starts (`crates/testkit`: scenarios; `crates/workload`: the workload and
//!   its launcher; `crates/cli`: the tool; `crates/demo`: demo and bench; `crates/control` is only
//!   checked for the switches) call no multicast entry point except through the one gate: the
//!   workload's `mc-*` commands ([`GATED`]), each of which first calls `self.fake_only(..)`, which
//!   refuses unless the loaded library is the bundled fake (`is_bundled_fake()`: a symbol no real
//!   driver exports). A multicast name anywhere else, or a function of that file that reaches one
//!   before the gate, fails here; the demo refuses its multicast run before any `mc-*` command
//!   unless `--allow-multicast` was given; and they keep the switches (the workload's launcher,
//!   which testkit builds on, sets them on every process it starts, nothing clears the
//!   environment).
//!
//! The shim and its runtime are not scanned: they forward the application's own calls, and the
//! application is one of the above.
//!
//! The checks are textual (a multi-line `subprocess` call that passes `env=` on a line of its
//! own is not seen), so each one is also run on a copy of a script with the fault added, and
//! must find it.

use std::path::{Path, PathBuf};

/// The switches and the only values they may have.
const SWITCHES: [(&str, &str); 3] = [
    ("NCCL_NVLS_ENABLE", "0"),
    ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
    ("NVSHMEM_DISABLE_NVLS", "1"),
];

/// Names through which a script reaches multicast (case-sensitive substrings).
const SCRIPT_APIS: [&str; 11] = [
    "cuMulticast",
    "cudaMulticast",
    "_symmetric_memory",
    "symm_mem.",
    "enable_symm_mem",
    "SymmetricMemory",
    "nvshmem",
    "WindowRegister",
    "--sharing multicast",
    "--sharing=multicast",
    "--allow-multicast",
];

/// Names through which Rust code reaches a multicast entry point: the symbol names (dlsym,
/// cuGetProcAddress, PFN types), the property struct, the shim runtime's methods.
const RUST_APIS: [&str; 6] = [
    "cuMulticast",
    "CUmulticastObjectProp",
    "multicast_create",
    "multicast_add_device",
    "multicast_bind",
    "multicast_unbind",
];

/// The one file of the lane's programs allowed to reach multicast, behind its gate.
const GATED: &str = "crates/workload/src/server/exec/multicast.rs";

/// The demo's runs: its multicast run sends the gated commands, behind a gate of its own.
const DEMO: &str = "crates/demo/src/demo.rs";

/// Whether `line` is a comment or an import (naming a type is not calling anything).
fn inert(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("//") || t.starts_with("use ")
}

/// In the gated file: the gate must test the library, and every function that names a multicast
/// entry point must call the gate on an earlier line of its body.
fn gate_violations(source: &Source) -> Vec<String> {
    let mut out = Vec::new();
    let mut functions: Vec<(usize, Vec<&str>)> = Vec::new();
    let mut header: Vec<(usize, &str)> = Vec::new();
    for (i, line) in source.text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("fn ") || t.starts_with("pub fn ") || t.starts_with("pub(super) fn ") {
            functions.push((i + 1, Vec::new()));
        }
        match functions.last_mut() {
            Some((_, body)) => body.push(line),
            None => header.push((i + 1, line)),
        }
    }
    let gate = functions
        .iter()
        .find(|(_, body)| body.first().is_some_and(|l| l.contains("fn fake_only(")));
    match gate {
        Some((_, body)) if body.iter().any(|l| l.contains("is_bundled_fake()")) => {}
        _ => out.push(format!(
            "{}: the gate `fn fake_only` does not test `is_bundled_fake()`",
            source.name
        )),
    }
    for (n, line) in header {
        if !inert(line) && RUST_APIS.iter().any(|api| line.contains(api)) {
            out.push(format!(
                "{}:{n}: reaches multicast outside a gated function",
                source.name
            ));
        }
    }
    for (start, body) in &functions {
        if body.first().is_some_and(|l| l.contains("fn fake_only(")) {
            if let Some(k) = body
                .iter()
                .position(|l| !inert(l) && RUST_APIS.iter().any(|api| l.contains(api)))
            {
                out.push(format!(
                    "{}:{}: the gate itself reaches multicast",
                    source.name,
                    start + k
                ));
            }
            continue;
        }
        let gated_at = body.iter().position(|l| l.contains("self.fake_only("));
        for (k, line) in body.iter().enumerate() {
            if inert(line) || !RUST_APIS.iter().any(|api| line.contains(api)) {
                continue;
            }
            if gated_at.is_none_or(|g| g > k) {
                out.push(format!(
                    "{}:{}: reaches multicast before the gate (`self.fake_only(..)?` first)",
                    source.name,
                    start + k
                ));
            }
        }
    }
    out
}

/// The demo's multicast path (`cuinterpose demo --sharing multicast`) sends the workload's `mc-*`
/// commands; the workload refuses them on a real driver, and the demo must refuse first unless the
/// user allowed multicast: its gate (`!options.allow_multicast` followed by a `bail!`) comes before
/// the first `mc-` command it names.
fn demo_gate_violations(source: &Source) -> Vec<String> {
    let text = &source.text;
    let Some(first_command) = text.find("\"mc-") else {
        return Vec::new();
    };
    let gate = text
        .find("!options.allow_multicast")
        .filter(|&g| g < first_command && text[g..first_command].contains("bail!("));
    match gate {
        Some(_) => Vec::new(),
        None => vec![format!(
            "{}: sends multicast commands without refusing first unless --allow-multicast was \
             given (`if .. && !options.allow_multicast {{ bail!(..) }}`)",
            source.name
        )],
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A lane file: its name (for messages) and its text.
#[derive(Debug, Clone)]
struct Source {
    name: String,
    text: String,
}

fn lane_sources() -> Vec<Source> {
    let root = repo();
    let mut out = vec![Source {
        name: "scripts/gpu-lane.sh".into(),
        text: read(&root.join("scripts/gpu-lane.sh")),
    }];
    let mut py: Vec<PathBuf> = std::fs::read_dir(root.join("scripts/gpu"))
        .expect("scripts/gpu")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    py.sort();
    assert!(
        py.iter().any(|p| p.ends_with("lane_common.py")),
        "scripts/gpu/lane_common.py is gone"
    );
    for p in py {
        let name = format!(
            "scripts/gpu/{}",
            p.file_name().unwrap_or_default().to_string_lossy()
        );
        out.push(Source {
            name,
            text: read(&p),
        });
    }
    out
}

fn rust_sources(dirs: &[&str]) -> Vec<Source> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<Source>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let name = p
                    .strip_prefix(root)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .into_owned();
                out.push(Source {
                    name,
                    text: read(&p),
                });
            }
        }
    }
    let root = repo();
    let mut out = Vec::new();
    for d in dirs {
        walk(&root.join(d), &root, &mut out);
    }
    out
}

fn is_shell(s: &Source) -> bool {
    s.name.ends_with(".sh")
}

/// `NAME=VALUE` (shell) or `"NAME": "VALUE"` / `["NAME"] = "VALUE"` (Python) assignments of a
/// switch to anything but its safe value, on one line.
fn bad_assignment(line: &str) -> Option<String> {
    for (name, safe) in SWITCHES {
        let mut rest = line;
        while let Some(at) = rest.find(name) {
            let after = &rest[at + name.len()..];
            let value = after
                .trim_start_matches(['"', '\'', ']'])
                .trim_start()
                .strip_prefix([':', '='])
                .map(|v| {
                    v.trim_start()
                        .trim_start_matches(['"', '\''])
                        .split(|c: char| !c.is_ascii_alphanumeric())
                        .next()
                        .unwrap_or("")
                });
            if let Some(v) = value
                && v != safe
            {
                return Some(format!("{name} set to {v:?} (must be {safe})"));
            }
            rest = after;
        }
    }
    None
}

/// Everything wrong with the lane scripts, one message per finding.
fn lane_violations(sources: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for s in sources {
        let mut say = |line_no: usize, what: String| {
            out.push(format!("{}:{}: {what}", s.name, line_no + 1));
        };
        for (i, line) in s.text.lines().enumerate() {
            for api in SCRIPT_APIS {
                if line.contains(api) {
                    say(i, format!("names multicast ({api})"));
                }
            }
            if let Some(what) = bad_assignment(line) {
                say(i, what);
            }
            let code = line.trim_start();
            let comment = code.starts_with('#');
            for (name, _) in SWITCHES {
                let unsets = [
                    format!("unset {name}"),
                    format!("-u {name}"),
                    format!("pop(\"{name}\""),
                    format!("del os.environ[\"{name}\"]"),
                ];
                if !comment && unsets.iter().any(|u| line.contains(u.as_str())) {
                    say(i, format!("removes {name}"));
                }
            }
            if is_shell(s) && !comment {
                // `env -i` starts a program with an empty environment.
                if line.contains("env -i") || line.contains("env --ignore-environment") {
                    say(i, "starts a process with an empty environment".into());
                }
                // A scenario, demo or command that asks for multicast by name.
                let words = line.replace(SWITCHES[1].0, "");
                if words.to_ascii_lowercase().contains("multicast") {
                    say(i, "asks for multicast".into());
                }
            }
            if !is_shell(s)
                && !comment
                && ["subprocess.", "Popen(", "os.exec", "os.spawn", "execve("]
                    .iter()
                    .any(|c| line.contains(c))
                && line.contains("env=")
                && !line.contains("os.environ")
            {
                say(i, "starts a process with an environment of its own".into());
            }
        }
        if is_shell(s) {
            // The switches are exported before the first program the lane starts.
            let lines: Vec<&str> = s.text.lines().collect();
            let export = lines.iter().position(|l| {
                l.starts_with("export ")
                    && SWITCHES
                        .iter()
                        .all(|(n, v)| l.split_whitespace().any(|w| w == format!("{n}={v}")))
            });
            let first_program = lines.iter().position(|l| {
                let l = l.trim_start();
                !l.starts_with('#')
                    && ["$bin/", "python3", "nvidia-smi", "timeout ", "gcc "]
                        .iter()
                        .any(|p| l.contains(p))
            });
            match (export, first_program) {
                (None, _) => out.push(format!(
                    "{}: no top-level `export` of all three switches",
                    s.name
                )),
                (Some(e), Some(p)) if e > p => out.push(format!(
                    "{}:{}: a program starts before the switches are exported (line {})",
                    s.name,
                    p + 1,
                    e + 1
                )),
                _ => {}
            }
        } else if s.name.ends_with("/lane_common.py") {
            for (n, v) in SWITCHES {
                if !s.text.contains(&format!("\"{n}\": \"{v}\"")) {
                    out.push(format!("{}: MULTICAST_OFF lacks {n}={v}", s.name));
                }
            }
            if !s
                .text
                .lines()
                .any(|l| l.starts_with("os.environ.update(MULTICAST_OFF)"))
            {
                out.push(format!(
                    "{}: does not set MULTICAST_OFF at module level",
                    s.name
                ));
            }
        } else {
            // Imported at module level (so spawned children, which re-import the main module,
            // set the switches too), and before torch.
            let lines: Vec<&str> = s.text.lines().collect();
            let common = lines.iter().position(|l| {
                l.starts_with("import lane_common") || l.starts_with("from lane_common import")
            });
            let torch = lines.iter().position(|l| {
                let l = l.trim_start();
                l.starts_with("import torch") || l.starts_with("from torch")
            });
            match (common, torch) {
                (None, _) => out.push(format!(
                    "{}: does not import lane_common at module level",
                    s.name
                )),
                (Some(c), Some(t)) if t < c => out.push(format!(
                    "{}:{}: imports torch before lane_common",
                    s.name,
                    t + 1
                )),
                _ => {}
            }
        }
    }
    out
}

/// Multicast entry points reachable from the programs the lane starts (with `apis`), and ways
/// they could drop the switches.
fn program_violations(sources: &[Source], apis: bool) -> Vec<String> {
    let mut out = Vec::new();
    for s in sources {
        let gated = apis && s.name == GATED;
        if gated {
            out.extend(gate_violations(s));
        }
        for (i, line) in s.text.lines().enumerate() {
            let at = format!("{}:{}", s.name, i + 1);
            for api in RUST_APIS.iter().filter(|_| apis && !gated) {
                if line.contains(api) {
                    out.push(format!(
                        "{at}: reaches multicast ({api}) with no gate: the lane runs this on a \
                         real driver; refuse unless the driver is the fake (testkit: \
                         `TestEnv::driver() == DriverKind::Fake`) and teach this test that gate"
                    ));
                }
            }
            if line.contains("env_clear(") {
                out.push(format!(
                    "{at}: clears the environment of a process it starts"
                ));
            }
            for (name, _) in SWITCHES {
                if line.contains(&format!("env_remove(\"{name}\"")) {
                    out.push(format!("{at}: removes {name}"));
                }
            }
            if let Some(what) = bad_assignment(line) {
                out.push(format!("{at}: {what}"));
            }
        }
    }
    out
}

#[test]
fn lane_scripts_never_reach_multicast_and_keep_the_switches() {
    let sources = lane_sources();
    let found = lane_violations(&sources);
    assert!(found.is_empty(), "GPU lane scripts:\n{}", found.join("\n"));
}

#[test]
fn lane_programs_call_no_multicast_and_keep_the_switches() {
    // The scenarios, workloads, the tool, demo and bench: no multicast call, no switch dropped.
    let sources = rust_sources(&[
        "crates/testkit/src",
        "crates/workload/src",
        "crates/cli/src",
        "crates/demo/src",
    ]);
    assert!(
        sources.iter().any(|s| s.name.ends_with("scenarios.rs")),
        "crates/testkit/src/scenarios.rs is gone"
    );
    assert!(
        sources.iter().any(|s| s.name.ends_with("server/exec.rs")),
        "crates/workload/src/server/exec.rs is gone"
    );
    let mut found = program_violations(&sources, true);
    let demo = sources.iter().find(|s| s.name == DEMO).expect(DEMO);
    found.extend(demo_gate_violations(demo));
    // The tool's library starts CRIU and test processes: it may name multicast (protocol,
    // refusals) but must not drop the switches.
    found.extend(program_violations(
        &rust_sources(&["crates/control/src"]),
        false,
    ));
    assert!(
        found.is_empty(),
        "programs the GPU lane starts:\n{}",
        found.join("\n")
    );

    // The launcher (testkit's environments are launchers) sets the switches on every process it
    // starts.
    let harness = sources
        .iter()
        .find(|s| s.name.ends_with("workload/src/launch.rs"))
        .expect("crates/workload/src/launch.rs");
    for (n, v) in SWITCHES {
        assert!(
            harness.text.contains(&format!("(\"{n}\", \"{v}\")")),
            "NO_MULTICAST_ENV lacks {n}={v}"
        );
    }
    assert!(
        harness.text.contains("for (k, v) in NO_MULTICAST_ENV"),
        "Launcher::command no longer applies NO_MULTICAST_ENV"
    );
}

/// A change made to a copy of a script.
type Edit = dyn Fn(&str) -> String;

/// Each check finds its fault in a copy of a real script: the test can fail.
#[test]
fn the_checks_find_faults_added_to_copies_of_the_scripts() {
    let sources = lane_sources();
    let with = |name: &str, edit: &Edit| -> Vec<String> {
        let copy: Vec<Source> = sources
            .iter()
            .map(|s| Source {
                name: s.name.clone(),
                text: if s.name.ends_with(name) {
                    edit(&s.text)
                } else {
                    s.text.clone()
                },
            })
            .collect();
        lane_violations(&copy)
    };
    let appended = |line: &'static str| move |t: &str| format!("{t}\n{line}\n");
    let cases: Vec<(&str, Box<Edit>, &str)> = vec![
        (
            "torch_share.py",
            Box::new(appended(
                "    lib.cuMulticastCreate(ctypes.byref(h), ctypes.byref(prop))",
            )),
            "names multicast (cuMulticast)",
        ),
        (
            "nccl_tp.py",
            Box::new(appended(
                "    import torch.distributed._symmetric_memory as symm_mem",
            )),
            "names multicast (_symmetric_memory)",
        ),
        (
            "gpu-lane.sh",
            Box::new(appended("NCCL_NVLS_ENABLE=1 \"$bin/cuinterpose\" demo")),
            "NCCL_NVLS_ENABLE set to \"1\"",
        ),
        (
            "gpu-lane.sh",
            Box::new(appended("\"$bin/cuinterpose\" demo --sharing multicast")),
            "asks for multicast",
        ),
        (
            "gpu-lane.sh",
            Box::new(appended(
                "\"$bin/cuinterpose\" demo --fake --sharing=multicast",
            )),
            "names multicast (--sharing=multicast)",
        ),
        (
            "gpu-lane.sh",
            Box::new(appended(
                "\"$bin/cuinterpose\" demo --fake --allow-multicast",
            )),
            "names multicast (--allow-multicast)",
        ),
        (
            "gpu-lane.sh",
            Box::new(appended("env -u NVSHMEM_DISABLE_NVLS python3 x.py")),
            "removes NVSHMEM_DISABLE_NVLS",
        ),
        (
            "gpu-lane.sh",
            Box::new(|t: &str| {
                t.replacen(
                    "export NCCL_NVLS_ENABLE=0",
                    "nvidia-smi\nexport NCCL_NVLS_ENABLE=0",
                    1,
                )
            }),
            "a program starts before the switches are exported",
        ),
        (
            "restore_before_unlock.py",
            Box::new(appended("    subprocess.Popen([sys.executable], env={})")),
            "an environment of its own",
        ),
        (
            "lane_common.py",
            Box::new(|t: &str| t.replace("\"TORCH_SYMM_MEM_DISABLE_MULTICAST\": \"1\"", "")),
            "MULTICAST_OFF lacks TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
        ),
        (
            "native_contrast.py",
            Box::new(|t: &str| t.replace("from lane_common import", "    from lane_common import")),
            "does not import lane_common at module level",
        ),
        (
            "torch_share.py",
            Box::new(|t: &str| format!("import torch\n{t}")),
            "imports torch before lane_common",
        ),
    ];
    for (file, edit, expected) in &cases {
        let found = with(file, edit.as_ref());
        assert!(
            found
                .iter()
                .any(|f| f.contains(file) && f.contains(expected)),
            "a copy of {file} with the fault {expected:?} passed: {found:?}"
        );
    }

    let program = |text: &str| {
        program_violations(
            &[Source {
                name: "crates/testkit/src/scenarios.rs".into(),
                text: text.into(),
            }],
            true,
        )
    };
    assert!(
        program("let f = lib.get::<PFN_cuMulticastCreate>(b\"cuMulticastCreate\");")
            .iter()
            .any(|f| f.contains("reaches multicast (cuMulticast)"))
    );
    // The gate: a copy of the gated file with one command's gate call removed, or with a gate
    // that does not test the library, is refused.
    let gated = rust_sources(&["crates/workload/src/server/exec"])
        .into_iter()
        .find(|s| s.name == GATED)
        .expect("the gated multicast commands");
    assert!(
        program_violations(std::slice::from_ref(&gated), true).is_empty(),
        "the gated file as it is passes"
    );
    for (edit, expected) in [
        (
            gated
                .text
                .replacen("self.fake_only(\"mc-bind-mem\")?;", "", 1),
            "before the gate",
        ),
        (
            gated.text.replacen("is_bundled_fake()", "is_loaded()", 1),
            "does not test `is_bundled_fake()`",
        ),
        (
            format!(
                "{}\nfn extra(&self) {{ self.driver.api().multicast_unbind(mc, 0, 0, 0); }}\n",
                gated.text
            ),
            "before the gate",
        ),
    ] {
        let found = program_violations(
            &[Source {
                name: GATED.into(),
                text: edit,
            }],
            true,
        );
        assert!(
            found.iter().any(|f| f.contains(expected)),
            "a faulty copy of the gated file passed ({expected}): {found:?}"
        );
    }
    // The demo's gate: removed, or moved after the first multicast command, it is missed.
    let demo = rust_sources(&["crates/demo/src"])
        .into_iter()
        .find(|s| s.name == DEMO)
        .expect(DEMO);
    assert!(
        demo.text.contains("\"mc-create"),
        "the demo's multicast path is gone"
    );
    assert!(demo_gate_violations(&demo).is_empty());
    let ungated = Source {
        name: demo.name.clone(),
        text: demo.text.replacen("!options.allow_multicast", "false", 1),
    };
    assert!(
        !demo_gate_violations(&ungated).is_empty(),
        "a demo without its gate passed"
    );
    assert!(
        program("cmd.env_clear();")
            .iter()
            .any(|f| f.contains("clears the environment"))
    );
    assert!(
        program("cmd.env_remove(\"NCCL_NVLS_ENABLE\");")
            .iter()
            .any(|f| f.contains("removes NCCL_NVLS_ENABLE"))
    );
}
