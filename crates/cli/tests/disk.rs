//! Checkpoint to disk and restore, end to end on the fake driver with the real CRIU: a two-process
//! group sharing memory both ways, started by `cuinterpose run --pid-namespace`, checkpointed by
//! `cuinterpose checkpoint`, gone, restored by `cuinterpose restore` (also onto swapped devices,
//! into another sandbox's namespaces, from one emulated container into another), and verified;
//! `--leave-running`; and every kind of bad input a restore must refuse.
//!
//! CRIU comes from `$CUINTERPOSE_CRIU` (scripts/test.sh exports it) or `<repo>/.criu/bin/criu`; a
//! missing CRIU fails the tests with a message to run scripts/install-criu.sh. CRIU needs root.

mod common;

use common::{
    attach_ranks, end_namespace, start_namespace, start_namespace_under, start_under, tool_path,
};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use testkit::container::{self, root_of};
use testkit::runtime as container_runtime;
use testkit::{TestEnv, Workload};

/// Bytes rank 0 and rank 1 share: different sizes, so that a swap of devices shows in the usage
/// of each device and not only per process.
const SIZE: [u64; 2] = [4 << 20, 2 << 20];
/// Generous, for a loaded two-core machine.
const TOOL_TIMEOUT: Duration = Duration::from_secs(300);
const READY_TIMEOUT: Duration = Duration::from_secs(120);

fn criu() -> PathBuf {
    let path = std::env::var_os("CUINTERPOSE_CRIU")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.criu/bin/criu")
                .to_path_buf()
        });
    assert!(
        path.is_file(),
        "CRIU not found at {} (set CUINTERPOSE_CRIU): run scripts/install-criu.sh first",
        path.display()
    );
    path
}

/// A test's environment: private directories, the fake driver, the tool.
struct Disk {
    env: TestEnv,
    tool: PathBuf,
    criu: PathBuf,
    /// `checkpoint_and_stop` passes `--self-contained`: the data files in the checkpoint
    /// directory, for the tests of what a restore and discard make of them.
    self_contained: std::sync::atomic::AtomicBool,
}

impl Disk {
    fn new() -> Disk {
        let env = TestEnv::fake().expect("test environment");
        Disk {
            tool: tool_path(&env),
            env,
            criu: criu(),
            self_contained: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// `cuinterpose ARGS` in this environment; waits (bounded) for it.
    fn tool(&self, args: &[&str]) -> Output {
        self.tool_with(args, &[])
    }

    /// `cuinterpose ARGS` with extra environment variables (fault injection in the tool's own
    /// driver calls).
    fn tool_with(&self, args: &[&str], vars: &[(&str, &str)]) -> Output {
        let mut command = self.env.command(&self.tool, false).expect("tool command");
        command.env("CUINTERPOSE_SIGNING_KEY", self.signing_key());
        command.envs(vars.iter().copied());
        command
            .args(args)
            .env("CUINTERPOSE_CRIU", &self.criu)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command.spawn().expect("starting cuinterpose");
        wait_output(
            child,
            TOOL_TIMEOUT,
            &format!("cuinterpose {}", args.join(" ")),
        )
    }

    /// `cuinterpose ARGS --json`, which must succeed; its JSON.
    fn tool_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.tool(&all);
        assert!(
            out.status.success(),
            "cuinterpose {} failed ({}):\n{}",
            all.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON report")
    }

    fn listen_dir(&self) -> PathBuf {
        self.env.socket_dir().join("t")
    }

    /// Starts `cuinterpose run --pid-namespace -- cuinterpose-workload tree --processes 2` (rank
    /// `r` on device `r`) and builds the sharing both ways: rank 0 creates `a0`, rank 1 `a1`, each
    /// exported to the other, which imports and maps it; both filled with their seeds.
    fn start_group(&self) -> Running {
        self.start_group_with(&[])
    }

    /// [`Disk::start_group`] with extra environment variables for the workload's shims.
    fn start_group_with(&self, vars: &[(&str, &str)]) -> Running {
        self.start_group_under(vars, &[])
    }

    /// [`Disk::start_group_with`], the launcher run by `wrapper` ([`start_namespace_under`]).
    fn start_group_under(&self, vars: &[(&str, &str)], wrapper: &[&str]) -> Running {
        let launcher = start_namespace_under(
            &self.env,
            "launcher",
            &self.listen_dir(),
            (2, "0,1"),
            vars,
            READY_TIMEOUT,
            wrapper,
        );
        self.started(launcher)
    }

    /// The sharing of [`Disk::start_group`] built in a tree `launcher` started.
    fn started(&self, launcher: Child) -> Running {
        let ranks = self.attach();
        for (r, w) in ranks.iter().enumerate() {
            let size = SIZE[r];
            w.all_ok(&[
                &format!("create a{r} {size} --handle-types posix"),
                &format!("reserve r-a{r} {size}"),
                &format!("map a{r} r-a{r}"),
                &format!("set-access a{r} --device {r}"),
                &format!("export a{r}"),
                &format!("fill a{r} {}", seed(r, 1)),
            ])
            .expect("creating the shared allocations");
        }
        self.hold_renamed_file(&ranks[0]);
        for (from, to) in [(0usize, 1usize), (1, 0)] {
            let size = SIZE[from];
            ranks[from]
                .ok(&format!("send-fd a{from} --to {to}"))
                .expect("send-fd");
            ranks[to]
                .all_ok(&[
                    &format!("wait fd a{from}"),
                    &format!("import a{from} --size {size}"),
                    &format!("reserve r-a{from} {size}"),
                    &format!("map a{from} r-a{from}"),
                    &format!("set-access a{from} --device {to}"),
                ])
                .expect("importing");
        }
        Running { launcher, ranks }
    }

    /// The file rank 0 holds open under a deleted name (see `hold_renamed_file`), by its other name.
    fn held_file(&self) -> PathBuf {
        self.env.dir().join("held")
    }

    /// Makes rank 0 hold a file as glibc's `sem_open` leaves every named POSIX semaphore (each
    /// Python multiprocessing lock of a PyTorch job): opened under a temporary name that is then
    /// linked to the final name and unlinked. CRIU dumps it as a link remap, a hard link the
    /// images need at restore.
    fn hold_renamed_file(&self, rank0: &Workload) {
        let temporary = self.env.dir().join("held.tmp");
        std::fs::write(&temporary, b"held by rank 0").expect("held file");
        rank0
            .ok(&format!("open-fd held {}", temporary.display()))
            .expect("open-fd");
        std::fs::hard_link(&temporary, self.held_file()).expect("final name");
        std::fs::remove_file(&temporary).expect("unlinking the temporary name");
    }

    /// Whether process `pid` holds the held file open (the same inode as its final name).
    fn holds_file(&self, pid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        let held = std::fs::metadata(self.held_file()).expect("held file");
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("fds")
            .flatten()
            .filter_map(|fd| std::fs::metadata(fd.path()).ok())
            .any(|m| (m.dev(), m.ino()) == (held.dev(), held.ino()))
    }

    /// Where the checkpoint keeps the link remaps its manifest lists; each must be there, and
    /// CRIU's own name for it free (the next dump may need it).
    fn link_remaps(&self) -> Vec<PathBuf> {
        let manifest: serde_json::Value = serde_json::from_slice(
            &std::fs::read(self.checkpoint_dir().join("manifest.json")).expect("manifest"),
        )
        .expect("manifest JSON");
        manifest["criu"]["link_remaps"]
            .as_array()
            .expect("link remaps")
            .iter()
            .map(|r| {
                let link = Path::new(r["link"].as_str().expect("link"));
                assert!(!link.exists(), "{} is still there", link.display());
                PathBuf::from(r["kept_as"].as_str().expect("kept as"))
            })
            .inspect(|p| assert!(p.is_file(), "{} is missing", p.display()))
            .collect()
    }

    /// Handles on ranks 0 and 1 of the tree (whoever runs it now: the original or a restored one).
    fn attach(&self) -> Vec<Workload> {
        attach_ranks(&self.listen_dir(), 2, "rank", |r| r as i32)
    }

    /// Fake device usage of ns pid `ns_pid` (the fake names its usage files by the process's own
    /// pid) on `device`.
    fn usage(&self, ns_pid: u32, device: i32) -> u64 {
        self.env.fake_usage(ns_pid, device).expect("fake usage")
    }

    /// Usage per (rank, device).
    fn usage_table(&self) -> [[u64; 2]; 2] {
        let mut t = [[0; 2]; 2];
        for (r, row) in t.iter_mut().enumerate() {
            for (d, cell) in row.iter_mut().enumerate() {
                *cell = self.usage(r as u32 + 1, d as i32);
            }
        }
        t
    }

    fn checkpoint_dir(&self) -> PathBuf {
        self.env.dir().join("ck")
    }

    /// The key this test's checkpoints are signed with (made by the first checkpoint).
    fn signing_key(&self) -> PathBuf {
        self.env.dir().join("keys/checkpoint.key")
    }

    /// Whether anything answers on a rank's socket.
    fn group_answers(&self) -> bool {
        (0..2).any(|r| {
            std::os::unix::net::UnixStream::connect(self.listen_dir().join(format!("{r}.sock")))
                .is_ok()
        })
    }
}

/// The launched group: the launcher (our child) and the ranks.
struct Running {
    launcher: Child,
    ranks: Vec<Workload>,
}

impl Drop for Running {
    fn drop(&mut self) {
        end_namespace(&mut self.launcher);
    }
}

/// A restored tree (not our child): killed at the end of the test.
struct Restored(u32);

impl Drop for Restored {
    fn drop(&mut self) {
        let _ = control::launch::kill_tree(self.0, Duration::from_secs(30));
    }
}

fn seed(rank: usize, round: u64) -> u64 {
    1000 * round + rank as u64 + 1
}

fn wait_output(child: Child, timeout: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => out.expect("waiting for a command"),
        Err(_) => {
            // Our own child, not reaped yet (the waiting thread still holds it).
            if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            panic!("{what} did not finish in {} s", timeout.as_secs());
        }
    }
}

/// Waits for a child (bounded) and returns its status.
fn wait_child(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    control::launch::wait_exit(child.id(), timeout)
        .unwrap_or_else(|e| panic!("pid {}: {e}", child.id()));
    child.wait().expect("reaping the child")
}

/// Contents kept in both processes, then a write by each process seen by the other.
fn verify_sharing(ranks: &[Workload], round: u64) {
    for creator in 0..2usize {
        let importer = 1 - creator;
        let region = format!("a{creator}");
        ranks[creator]
            .assert_pattern(&region, seed(creator, round))
            .expect("creator's contents");
        ranks[importer]
            .assert_pattern(&region, seed(creator, round))
            .expect("importer's contents");
        ranks[importer]
            .ok(&format!("fill {region} {}", seed(creator, round + 1)))
            .expect("importer writes");
        ranks[creator]
            .assert_pattern(&region, seed(creator, round + 1))
            .expect("the creator sees the importer's write");
        ranks[creator]
            .ok(&format!("fill {region} {}", seed(creator, round + 2)))
            .expect("creator writes");
        ranks[importer]
            .assert_pattern(&region, seed(creator, round + 2))
            .expect("the importer sees the creator's write");
    }
}

/// SHA-256 of every file under `dir` (relative path → digest), to prove a restore left it alone.
/// A restore of the checkpoint with `extra` arguments is refused (exit 3) saying `message`, and
/// changes nothing: the checkpoint's files hash as `before`, and nothing restored answers.
fn assert_restore_refused(
    disk: &Disk,
    extra: &[&str],
    message: &str,
    before: &BTreeMap<PathBuf, String>,
) {
    let dir = disk.checkpoint_dir();
    let mut args = vec!["restore", "--dir", dir.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    let out = disk.tool(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(message), "{stderr}");
    assert_eq!(
        &hash_dir(&dir),
        before,
        "a refused restore changed the checkpoint"
    );
    assert!(
        !disk.group_answers(),
        "a refused restore restored something"
    );
}

fn hash_dir(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(base, &path, out);
            } else {
                let mut bytes = Vec::new();
                std::fs::File::open(&path)
                    .and_then(|mut f| f.read_to_end(&mut bytes))
                    .expect("reading a checkpoint file");
                let rel = path.strip_prefix(base).unwrap_or(&path).to_path_buf();
                out.insert(rel, protocol::manifest::sha256_hex(&bytes));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn phase_names(report: &serde_json::Value) -> Vec<String> {
    report["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| p["name"].as_str().expect("phase name").to_string())
        .collect()
}

/// Checkpoints the running group into the test's checkpoint directory, checks that its processes
/// are gone, and returns the report and the manifest.
fn checkpoint_and_stop(disk: &Disk, group: &mut Running) -> (serde_json::Value, serde_json::Value) {
    let launcher = group.launcher.id();
    checkpoint_at_and_stop(disk, group, launcher)
}

/// [`checkpoint_and_stop`] with `--pid PID` (a process of the group's tree).
fn checkpoint_at_and_stop(
    disk: &Disk,
    group: &mut Running,
    pid: u32,
) -> (serde_json::Value, serde_json::Value) {
    checkpoint_target_and_stop(disk, group, &["--pid", &pid.to_string()], &[])
}

/// [`checkpoint_at_and_stop`] of the tree `target` names (`--pid PID`, `--container RUNTIME:NAME`),
/// with `vars` in the tool's environment.
fn checkpoint_target_and_stop(
    disk: &Disk,
    group: &mut Running,
    target: &[&str],
    vars: &[(&str, &str)],
) -> (serde_json::Value, serde_json::Value) {
    let dir = disk.checkpoint_dir();
    let mut args = vec!["checkpoint"];
    args.extend_from_slice(target);
    args.extend(["--dir", dir.to_str().expect("utf-8 path"), "--json"]);
    if disk
        .self_contained
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        args.push("--self-contained");
    }
    let out = disk.tool_with(&args, vars);
    assert!(
        out.status.success(),
        "cuinterpose {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let status = wait_child(&mut group.launcher, READY_TIMEOUT);
    assert!(
        !status.success(),
        "the launcher's workload was killed by CRIU"
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("manifest JSON");
    for p in manifest["participants"].as_array().expect("participants") {
        let pid = p["host_pid"].as_u64().expect("host pid");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still exists after the checkpoint"
        );
    }
    assert!(!disk.group_answers(), "nothing answers after the dump");
    assert_eq!(disk.usage_table(), [[0; 2]; 2]);
    (report, manifest)
}

fn restore(disk: &Disk, extra: &[&str]) -> (serde_json::Value, Restored) {
    restore_with(disk, extra, &[])
}

/// [`restore`] with `vars` in the tool's environment.
fn restore_with(
    disk: &Disk,
    extra: &[&str],
    vars: &[(&str, &str)],
) -> (serde_json::Value, Restored) {
    let dir = disk.checkpoint_dir();
    let mut args = vec!["restore", "--dir", dir.to_str().expect("utf-8 path")];
    args.extend_from_slice(extra);
    args.push("--json");
    let out = disk.tool_with(&args, vars);
    assert!(
        out.status.success(),
        "cuinterpose {} failed ({}):\n{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let root = report["root"].as_u64().expect("restored root") as u32;
    (report, Restored(root))
}

#[test]
fn checkpoint_to_disk_and_restore_keep_contents_and_sharing() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    let before = disk.usage_table();
    assert_eq!(before, [[SIZE[0], 0], [0, SIZE[1]]]);
    let host_pids: Vec<u32> = {
        let tree = control::discovery::process_tree(group.launcher.id()).expect("tree");
        tree.into_iter().skip(1).collect()
    };

    assert!(
        disk.holds_file(host_pids[0]),
        "rank 0 holds its renamed file"
    );
    let (report, manifest) = checkpoint_and_stop(&disk, &mut group);
    let phases = phase_names(&report);
    for wanted in [
        "inspect",
        "freeze",
        "save",
        "release",
        "native-checkpoint",
        "criu-dump",
    ] {
        assert!(phases.iter().any(|p| p == wanted), "{wanted} in {phases:?}");
    }
    // The shared bytes are in the block store beside the checkpoint (one file per 2 MiB block,
    // named by its BLAKE3), streamed there by each creating process's shim, and not in CRIU's
    // images: no image holds a piece of them (no carrier, no staging buffer).
    assert!(
        !disk.checkpoint_dir().join("data").exists(),
        "no data files in the directory"
    );
    let data = manifest["data_files"].as_array().expect("data files");
    assert_eq!(data.len(), 2, "{data:?}");
    for d in data {
        let ns_pid = d["ns_pid"].as_u64().expect("ns pid");
        assert_eq!(d["file"], format!("gpu-{ns_pid}.data"));
        let extents = d["extents"].as_array().expect("extents");
        assert_eq!(extents.len(), 1, "rank {ns_pid} creates one allocation");
        assert_eq!(extents[0]["size"], SIZE[ns_pid as usize - 1]);
        let blocks = block_paths(&disk, d);
        assert_eq!(
            blocks.len() as u64,
            SIZE[ns_pid as usize - 1] / BLOCK,
            "a block per 2 MiB"
        );
        let path = &blocks[0];
        let bytes = std::fs::read(path).expect("block");
        assert_eq!(
            blake3::hash(&bytes).to_hex().as_str(),
            path.file_name().expect("name").to_str().expect("utf-8"),
            "named by its BLAKE3"
        );
        let needle = &bytes[(1 << 20)..(1 << 20) + 256];
        for image in std::fs::read_dir(disk.checkpoint_dir().join("images")).expect("images") {
            let image = image.expect("image").path();
            let held = std::fs::read(&image).expect("image");
            assert!(
                !held.windows(needle.len()).any(|w| w == needle),
                "{} holds bytes of {}",
                image.display(),
                path.display()
            );
        }
    }
    assert_eq!(
        report["data_bytes"].as_u64().expect("data bytes")
            + report["zero_bytes"].as_u64().expect("zero bytes"),
        SIZE[0] + SIZE[1]
    );

    // The manifest: participants with host and namespace PIDs, the shim's digest, driver, GPUs,
    // byte counts, timings, CRIU.
    let participants = manifest["participants"].as_array().expect("participants");
    let mut ns_pids: Vec<u64> = participants
        .iter()
        .map(|p| p["ns_pid"].as_u64().expect("ns pid"))
        .collect();
    ns_pids.sort_unstable();
    assert_eq!(ns_pids, [1, 2]);
    for p in participants {
        let host = p["host_pid"].as_u64().expect("host pid") as u32;
        assert!(
            host_pids.contains(&host),
            "host pid {host} of {host_pids:?}"
        );
        let gpus = p["gpus"].as_array().expect("gpus");
        assert_eq!(gpus.len(), 2);
        assert!(gpus[1]["uuid"].as_str().expect("uuid").starts_with("GPU-"));
        assert_eq!(p["role"], "creator_and_importer");
        assert!(!p["sockets"].as_array().expect("sockets").is_empty());
    }
    let shim = disk.env.artifacts().shim().expect("shim");
    let shim_digest = protocol::manifest::sha256_hex(&std::fs::read(&shim).expect("shim bytes"));
    assert_eq!(manifest["shim"]["sha256"], shim_digest.as_str());
    assert_eq!(manifest["driver_version"], 13000);
    assert_eq!(manifest["bytes"]["saved"], SIZE[0] + SIZE[1]);
    assert!(
        manifest["criu"]["version"]
            .as_str()
            .expect("criu version")
            .starts_with('4')
    );
    assert_eq!(manifest["criu"]["image_bytes"], report["image_bytes"]);
    let timed: Vec<&str> = manifest["timings"]
        .as_array()
        .expect("timings")
        .iter()
        .map(|t| t["phase"].as_str().expect("phase"))
        .collect();
    assert!(
        timed.contains(&"save") && timed.contains(&"criu-dump"),
        "{timed:?}"
    );

    // Rank 0's renamed file is CRIU's one link remap, next to the file's deleted name.
    let remaps = disk.link_remaps();
    assert_eq!(remaps.len(), 1, "{remaps:?}");
    assert_eq!(remaps[0].parent(), Some(disk.env.dir()));

    let hashes = hash_dir(&disk.checkpoint_dir());
    let (report, restored) = restore(&disk, &[]);
    assert_eq!(
        hash_dir(&disk.checkpoint_dir()),
        hashes,
        "a restore leaves the checkpoint unchanged"
    );
    assert!(
        disk.holds_file(restored.0),
        "the restored rank 0 holds its file again"
    );
    assert_eq!(
        disk.link_remaps(),
        remaps,
        "the link remap is kept for the next restore"
    );
    let phases = phase_names(&report);
    for wanted in [
        "criu-restore",
        "native-restore",
        "load",
        "import",
        "verify",
        "thaw",
    ] {
        assert!(phases.iter().any(|p| p == wanted), "{wanted} in {phases:?}");
    }
    let ranks = disk.attach();
    assert_eq!(
        disk.usage_table(),
        before,
        "memory back on the same devices"
    );
    verify_sharing(&ranks, 1);

    // The descriptors the application holds are the shim's sealed tickets, which CRIU restored
    // as memfds: sent again, one still imports (a ticket whose seals were lost would be taken for
    // a foreign descriptor and refused by the driver).
    ranks[0]
        .ok("send-fd a0 --to 1 --as again")
        .expect("send-fd");
    ranks[1]
        .all_ok(&[
            "wait fd again",
            &format!("import again --size {}", SIZE[0]),
            &format!("reserve r-again {}", SIZE[0]),
            "map again r-again",
            "set-access again --device 1",
        ])
        .expect("importing a ticket after the restore");
    ranks[0].ok("fill a0 77").expect("fill");
    ranks[1]
        .assert_pattern("again", 77)
        .expect("the new import shares the bytes");

    // A second restore while the restored copy runs (new host PIDs, same sockets) is refused.
    let dir = disk.checkpoint_dir();
    let out = disk.tool(&["restore", "--dir", dir.to_str().expect("utf-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("is answered by a running process"),
        "{stderr}"
    );
    assert_eq!(hash_dir(&dir), hashes);
    ranks[1].ok("ping").expect("the restored copy still runs");
}

/// A failure after CRIU restored the tree (here the tool's native restore call fails) kills the
/// restored processes and leaves the checkpoint as it was, so the next restore works.
#[test]
fn a_failure_after_criu_restore_kills_the_restored_tree() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let dir = disk.checkpoint_dir();
    let hashes = hash_dir(&dir);
    let out = disk.tool_with(
        &["restore", "--dir", dir.to_str().expect("utf-8 path")],
        &[("FAKE_CUDA_FAIL", "cuCheckpointProcessRestore:1")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Undone: exit 4, the checkpoint unchanged and restorable again.
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(
        stderr.contains("were killed before their rebuild finished; the checkpoint is unchanged"),
        "{stderr}"
    );
    assert!(
        !disk.group_answers(),
        "nothing of the restore is left running"
    );
    assert_eq!(hash_dir(&dir), hashes);
    assert_eq!(
        disk.link_remaps().len(),
        1,
        "the failed restore kept the link remap"
    );
    let (_report, restored) = restore(&disk, &[]);
    verify_sharing(&disk.attach(), 1);
    assert!(disk.holds_file(restored.0));
}

/// The root of the tree a killed restore left stopped: the topmost stopped ancestor of a rank
/// (whose command line names this test's socket directory).
fn stopped_restored_root(disk: &Disk) -> u32 {
    let listen = disk.listen_dir();
    let listen = listen.to_str().expect("utf-8 path");
    let stat = |pid: u32| control::procfs::stat(pid);
    let rank = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(listen))
                && stat(pid).is_some_and(|s| s.stopped())
        })
        .expect("a stopped rank of the restored tree");
    let mut root = rank;
    while let Some(parent) = stat(root).map(|s| s.ppid) {
        if !stat(parent).is_some_and(|s| s.stopped()) {
            break;
        }
        root = parent;
    }
    root
}

/// A restore killed in its native restore (CRIU brought the tree back stopped, the group's state
/// is recorded, the tool dies inside `cuCheckpointProcessRestore`) is finished by `resume --pid
/// <restored root>`: each process restored with only its restore thread running (the fake
/// refuses a restore of a CRIU-restored process whose other threads run, as r580 crashes it),
/// then the tree continued and the shims rebuilt.
#[test]
fn a_restore_killed_in_its_native_restore_is_finished_by_resume() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let dir = disk.checkpoint_dir();
    let out = disk.tool_with(
        &["restore", "--dir", dir.to_str().expect("utf-8 path")],
        &[("FAKE_CUDA_FAIL", "cuCheckpointProcessRestore:1=die")],
    );
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9),
        "the tool died in the call: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let root = stopped_restored_root(&disk);
    let _restored = Restored(root);
    let tree = control::discovery::process_tree(root).expect("the restored tree");
    assert!(
        tree.iter()
            .all(|&pid| control::procfs::stat(pid).is_some_and(|s| s.stopped())),
        "CRIU's tree is still stopped"
    );
    let report = disk.tool_json(&["resume", "--pid", &root.to_string()]);
    assert_eq!(
        report["participants"].as_array().map(Vec::len),
        Some(2),
        "{report}"
    );
    verify_sharing(&disk.attach(), 1);
}

/// A restore killed while CRIU restores (here a CRIU that never finishes its restore) leaves its
/// work files beside the run locks, never in the checkpoint: `restore --cleanup` removes them, and
/// a restore after another kill clears them by itself and brings the group back.
#[test]
fn a_restore_killed_during_criu_is_cleaned_up_and_the_next_restore_works() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let dir = disk.checkpoint_dir();
    let dir_arg = dir.to_str().expect("utf-8 path");
    let hashes = hash_dir(&dir);
    let marker = disk.env.dir().join("criu-restoring");
    let stuck = disk.env.dir().join("stuck-criu");
    std::fs::write(
        &stuck,
        format!(
            "#!/bin/sh\ncase \"$1\" in restore) touch '{}'; exec sleep 300;; esac\nexec '{}' \"$@\"\n",
            marker.display(),
            disk.criu.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&stuck, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kill_during_criu = || {
        let _ = std::fs::remove_file(&marker);
        let mut command = disk.env.command(&disk.tool, false).expect("tool command");
        command
            .env("CUINTERPOSE_SIGNING_KEY", disk.signing_key())
            .args([
                "restore",
                "--dir",
                dir_arg,
                "--criu",
                stuck.to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut tool = command.spawn().expect("starting cuinterpose");
        let start = std::time::Instant::now();
        while !marker.exists() {
            assert!(
                start.elapsed() < TOOL_TIMEOUT,
                "CRIU's restore never started"
            );
            assert!(
                tool.try_wait().unwrap().is_none(),
                "the restore ended before CRIU ran"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        tool.kill().unwrap();
        assert!(!tool.wait().unwrap().success());
    };

    kill_during_criu();
    assert_eq!(
        hash_dir(&dir),
        hashes,
        "a killed restore never writes the checkpoint"
    );
    let report = disk.tool_json(&["restore", "--dir", dir_arg, "--cleanup"]);
    let work_dir = PathBuf::from(
        report["work_dir"]
            .as_str()
            .expect("a work directory was left"),
    );
    assert!(report["killed_root"].is_null(), "{report}");
    assert!(!work_dir.exists(), "{} was not removed", work_dir.display());
    let again = disk.tool_json(&["restore", "--dir", dir_arg, "--cleanup"]);
    assert!(
        again["work_dir"].is_null(),
        "nothing is left to clean up: {again}"
    );

    kill_during_criu();
    assert!(work_dir.is_dir(), "the killed restore left its work files");
    let (_report, _restored) = restore(&disk, &[]);
    verify_sharing(&disk.attach(), 1);
    assert!(!work_dir.exists(), "nothing of either restore is left");
    assert_eq!(hash_dir(&dir), hashes);
}

#[test]
fn restore_onto_swapped_devices_moves_the_memory() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    assert_eq!(disk.usage_table(), [[SIZE[0], 0], [0, SIZE[1]]]);
    checkpoint_and_stop(&disk, &mut group);
    let (_report, _restored) = restore(&disk, &["--device-map", "0=1,1=0"]);
    let ranks = disk.attach();
    // Rank 0's allocation (and context) is now on device 1, rank 1's on device 0.
    assert_eq!(disk.usage_table(), [[0, SIZE[0]], [SIZE[1], 0]]);
    let table = disk.usage_table();
    let per_device: Vec<u64> = (0..2).map(|d| table[0][d] + table[1][d]).collect();
    assert_eq!(per_device, [SIZE[1], SIZE[0]]);
    // The processes keep their own device ordinals, as on a real driver: ordinal 0 of rank 0 now
    // names the other GPU.
    let props = ranks[0].ok("get-props a0").expect("get-props");
    assert_eq!(props.u64("device"), Some(0));
    verify_sharing(&ranks, 1);
}

#[test]
fn leave_running_keeps_the_group_and_a_restore_waits_for_it_to_stop() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    let before = disk.usage_table();
    let dir = disk.checkpoint_dir();
    let launcher = group.launcher.id().to_string();
    let report = disk.tool_json(&[
        "checkpoint",
        "--pid",
        &launcher,
        "--dir",
        dir.to_str().expect("utf-8 path"),
        "--leave-running",
    ]);
    let phases = phase_names(&report);
    assert!(phases.iter().any(|p| p == "criu-dump"), "{phases:?}");
    assert!(phases.iter().any(|p| p == "thaw"), "resumed: {phases:?}");
    assert!(
        matches!(group.launcher.try_wait(), Ok(None)),
        "still running"
    );
    assert_eq!(disk.usage_table(), before);
    verify_sharing(&group.ranks, 1);

    // The original still runs: a restore is refused and changes nothing.
    let hashes = hash_dir(&dir);
    let out = disk.tool(&["restore", "--dir", dir.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("still running"), "{stderr}");
    assert_eq!(hash_dir(&dir), hashes);
    // The first round left each region with its third seed.
    verify_sharing(&group.ranks, 3);

    // Stopped (SIGTERM to the launcher, forwarded to the namespace's init), it restores to the
    // state of the dump.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(group.launcher.id() as i32).expect("pid"),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    wait_child(&mut group.launcher, READY_TIMEOUT);
    // CRIU's own --leave-running would have removed the link remap here, leaving images that
    // cannot be restored (seen with PyTorch on the H200).
    assert_eq!(disk.link_remaps().len(), 1);
    let (_report, restored) = restore(&disk, &[]);
    let ranks = disk.attach();
    assert_eq!(disk.usage_table(), before);
    verify_sharing(&ranks, 1);
    assert!(disk.holds_file(restored.0));
}

/// A damage done to a copy of the checkpoint, and the message the refusal must contain.
struct Damage {
    name: &'static str,
    apply: fn(&Path),
    message: &'static str,
}

fn largest_image(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir.join("images"))
        .expect("images")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .max_by_key(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .expect("a pages image")
        .path()
}

fn truncate(path: &Path) {
    let len = std::fs::metadata(path).expect("metadata").len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    file.set_len(len / 2).expect("truncate");
}

fn flip_byte(path: &Path) {
    let mut bytes = std::fs::read(path).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5a;
    std::fs::write(path, bytes).expect("write");
}

const DAMAGES: &[Damage] = &[
    Damage {
        name: "manifest missing",
        apply: |d| std::fs::remove_file(d.join("manifest.json")).expect("rm"),
        message: "manifest.json",
    },
    Damage {
        name: "manifest truncated",
        apply: |d| truncate(&d.join("manifest.json")),
        message: "manifest.json",
    },
    Damage {
        name: "manifest names another shim digest than the state file",
        apply: |d| edit_manifest(d, |m| m["shim"]["sha256"] = "0".repeat(64).into()),
        message: "inconsistent",
    },
    Damage {
        // As if the library at the recorded path had been rebuilt since the checkpoint.
        name: "the shim at the recorded path has other bytes",
        apply: |d| {
            let other = d.join("other-shim.so");
            std::fs::write(&other, b"not the shim").expect("write");
            edit_manifest(d, |m| {
                m["shim"]["path"] = other.to_string_lossy().as_ref().into()
            });
        },
        message: "is not the shim the checkpoint was taken with",
    },
    Damage {
        // A checkpoint of another tool version: refused by name (docs/design.md, "Versions").
        name: "manifest of another version",
        apply: |d| {
            edit_manifest(d, |m| {
                m["version"] = (protocol::manifest::MANIFEST_VERSION + 1).into()
            })
        },
        message: "recreate the checkpoint with this version",
    },
    Damage {
        // The state file of another version, recorded in the manifest with its own digest and
        // size, so that the version is what refuses.
        name: "state file of another version",
        apply: |d| {
            let path = d.join("cuinterpose.state");
            let mut bytes = std::fs::read(&path).expect("read");
            bytes[8..10].copy_from_slice(&(protocol::state::STATE_VERSION + 1).to_le_bytes());
            std::fs::write(&path, &bytes).expect("write");
            edit_manifest(d, |m| {
                m["state"]["sha256"] = protocol::manifest::sha256_hex(&bytes).into();
                m["state"]["bytes"] = bytes.len().into();
            });
        },
        message: "version mismatch",
    },
    Damage {
        name: "state file missing",
        apply: |d| std::fs::remove_file(d.join("cuinterpose.state")).expect("rm"),
        message: "cuinterpose.state",
    },
    Damage {
        name: "state file truncated",
        apply: |d| truncate(&d.join("cuinterpose.state")),
        message: "cuinterpose.state",
    },
    Damage {
        name: "state file tampered",
        apply: |d| flip_byte(&d.join("cuinterpose.state")),
        message: "cuinterpose.state",
    },
    Damage {
        name: "image digests missing",
        apply: |d| std::fs::remove_file(d.join("images.b3")).expect("rm"),
        message: "images.b3",
    },
    Damage {
        name: "page image missing",
        apply: |d| std::fs::remove_file(largest_image(d)).expect("rm"),
        message: "is missing",
    },
    Damage {
        name: "page image truncated",
        apply: |d| truncate(&largest_image(d)),
        message: "differs from its digest",
    },
    Damage {
        name: "page image tampered",
        apply: |d| flip_byte(&largest_image(d)),
        message: "differs from its digest",
    },
    Damage {
        name: "an image added",
        apply: |d| std::fs::write(d.join("images/extra.img"), b"x").expect("write"),
        message: "was not part of the checkpoint",
    },
    Damage {
        name: "manifest lists no link remap where the images have one",
        apply: |d| edit_manifest(d, |m| m["criu"]["link_remaps"] = serde_json::json!([])),
        message: "the manifest lists []",
    },
    Damage {
        name: "manifest names a file other than a link remap",
        apply: |d| {
            edit_manifest(d, |m| {
                m["criu"]["link_remaps"][0]["kept_as"] = "/etc/passwd".into()
            })
        },
        message: "not a link_remap.<id> file and its kept name",
    },
    Damage {
        name: "data file missing",
        apply: |d| std::fs::remove_file(d.join("data/gpu-1.data")).expect("rm"),
        message: "gpu-1.data",
    },
    Damage {
        name: "data file truncated",
        apply: |d| truncate(&d.join("data/gpu-1.data")),
        message: "the manifest records",
    },
    Damage {
        name: "images directory missing",
        apply: |d| std::fs::remove_dir_all(d.join("images")).expect("rm"),
        message: "images",
    },
];

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    edit(&mut m);
    std::fs::write(&path, serde_json::to_vec_pretty(&m).expect("json")).expect("write");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn bad_checkpoints_and_device_maps_are_refused_and_change_nothing() {
    let disk = Disk::new();
    // What is refused of data files in the directory (the block store's: store tests below).
    disk.self_contained
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let good = disk.checkpoint_dir();
    let good_hashes = hash_dir(&good);

    let refused = |dir: &Path, extra: &[&str], code: i32, message: &str, what: &str| {
        let before = hash_dir(dir);
        let mut args = vec!["restore", "--dir", dir.to_str().expect("utf-8 path")];
        args.extend_from_slice(extra);
        let out = disk.tool(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert!(
            stderr.contains(message),
            "{what}: {message:?} not in {stderr}"
        );
        assert_eq!(hash_dir(dir), before, "{what}: the directory changed");
        assert!(!disk.group_answers(), "{what}: something was restored");
        stderr.into_owned()
    };

    refused(
        &disk.env.dir().join("nothing-here"),
        &[],
        3,
        "is not a directory",
        "missing directory",
    );
    for damage in DAMAGES {
        let copy = disk.env.dir().join("damaged");
        copy_dir(&good, &copy);
        (damage.apply)(&copy);
        // Refused for its signature when the damage is to what it covers; each check behind it
        // still refuses the damage when the signature is not asked for.
        refused(&copy, &[], 3, "", damage.name);
        refused(&copy, &["--allow-unsigned"], 3, damage.message, damage.name);
        std::fs::remove_dir_all(&copy).expect("rm copy");
    }
    // A data file's bytes are checked as the shims load them: one of them damaged undoes the
    // restore (exit 4: the restored tree killed before its rebuild finished, the checkpoint
    // unchanged); asked to check first, the restore refuses it before CRIU runs (exit 3).
    let copy = disk.env.dir().join("damaged");
    copy_dir(&good, &copy);
    flip_byte(&copy.join("data/gpu-2.data"));
    refused(
        &copy,
        &["--verify-data-first"],
        3,
        "does not hash to the BLAKE3 the manifest records",
        "data file tampered, checked first",
    );
    let undone = refused(&copy, &[], 4, "hashes to", "data file tampered");
    assert!(
        undone.contains("were killed before their rebuild finished; the checkpoint is unchanged"),
        "{undone}"
    );
    std::fs::remove_dir_all(&copy).expect("rm copy");
    for (map, code, message) in [
        ("2=0", 3, "not among the 2 recorded GPUs"),
        ("0=7", 3, "does not exist here"),
        ("0=1,1=1", 3, "target of two mappings"),
        ("0=1", 3, "would receive two GPUs"),
        ("0-1", 2, "is not OLD=NEW"),
        ("0=x", 2, "is not a device ordinal"),
    ] {
        refused(&good, &["--device-map", map], code, message, map);
    }
    assert_eq!(hash_dir(&good), good_hashes);

    // The link remap CRIU restores through, gone: refused, nothing changes; back, it restores.
    let remap = disk.link_remaps().pop().expect("one link remap");
    let aside = disk.env.dir().join("aside");
    std::fs::rename(&remap, &aside).expect("moving the link remap away");
    refused(&good, &[], 3, "the images need it", "link remap missing");
    std::fs::rename(&aside, &remap).expect("putting it back");

    // The intact checkpoint restores.
    let (_report, _restored) = restore(&disk, &[]);
    verify_sharing(&disk.attach(), 1);
}

/// The inode of namespace `ns` (`net`, `ipc`, `uts`) of `pid`.
fn namespace_inode(pid: u32, ns: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{ns}"))
        .unwrap_or_else(|e| panic!("namespace {ns} of pid {pid}: {e}"))
        .ino()
}

/// A pod's sandbox as the kubelet makes one: a process holding network, IPC and UTS namespaces
/// of its own, which the pod's containers join.
struct Sandbox(Child);

impl Sandbox {
    fn start() -> Sandbox {
        let child = std::process::Command::new("unshare")
            .args(["--net", "--ipc", "--uts", "--", "sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let pid = child.id();
        let mine = namespace_inode(std::process::id(), "net");
        let deadline = std::time::Instant::now() + READY_TIMEOUT;
        while namespace_inode(pid, "net") == mine {
            assert!(std::time::Instant::now() < deadline, "unshare did not run");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sandbox(child)
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A group whose network, IPC and UTS namespaces are not the tool's (a pod's containers): the
/// checkpoint records them and dumps the network namespace as external; a restore without a
/// process to take namespaces from, or into a process in a container of its own, is refused with
/// nothing changed; with `--namespaces-of` of another sandbox (the placeholder pod) the restored
/// tree is in that sandbox's namespaces.
#[test]
fn a_group_in_namespaces_of_its_own_is_restored_into_another_sandboxs() {
    let disk = Disk::new();
    let mut group = disk.start_group_under(&[], &["unshare", "--net", "--ipc", "--uts", "--"]);
    let rank0 = control::discovery::process_tree(group.launcher.id()).expect("tree")[1];
    for ns in ["net", "ipc", "uts"] {
        assert_ne!(
            namespace_inode(rank0, ns),
            namespace_inode(std::process::id(), ns),
            "the group runs in a {ns} namespace of its own"
        );
    }
    let (report, manifest) = checkpoint_and_stop(&disk, &mut group);
    let all = serde_json::json!(["net", "ipc", "uts"]);
    assert_eq!(manifest["criu"]["shared_namespaces"], all, "{manifest}");
    assert_eq!(report["shared_namespaces"], all, "{report}");

    let dir = disk.checkpoint_dir();
    let before = hash_dir(&dir);
    assert_restore_refused(&disk, &[], "--namespaces-of PID", &before);

    // Into a container (its own root filesystem) a tree checkpointed outside any is refused: its
    // files are not there.
    let container = Placeholder::start(&disk, "root-c");
    let into_container = container.init.to_string();
    assert_restore_refused(
        &disk,
        &["--namespaces-of", &into_container],
        "taken outside any",
        &before,
    );
    drop(container);

    let placeholder = Sandbox::start();
    let target = placeholder.pid().to_string();
    let (report, restored) = restore(&disk, &["--namespaces-of", &target]);
    assert_eq!(report["shared_namespaces"], all, "{report}");
    let tree = control::discovery::process_tree(restored.0).expect("restored tree");
    assert_eq!(
        tree.len(),
        2,
        "the two ranks (rank 0 is the root): {tree:?}"
    );
    for pid in tree {
        for ns in ["net", "ipc", "uts"] {
            assert_eq!(
                namespace_inode(pid, ns),
                namespace_inode(placeholder.pid(), ns),
                "restored pid {pid} is not in the placeholder's {ns} namespace"
            );
        }
    }
    verify_sharing(&disk.attach(), 1);
}

/// The program and arguments that run a command as the init of a new emulated container
/// (testkit::container) over `root` (a new directory in the test's directory), with the build's
/// artifacts and the test's directory bound in; `kill_with_runtime` as there.
fn container_wrapper_as(disk: &Disk, root: &str, kill_with_runtime: bool) -> Vec<String> {
    let root = disk.env.dir().join(root);
    std::fs::create_dir(&root).expect("the container's root");
    let log = root.with_extension("log");
    let binds = [disk.env.artifacts().dir(), disk.env.dir()];
    container::wrapper(&root, &binds, &log, kill_with_runtime)
}

/// A placeholder's wrapper: killed when that `unshare` dies.
fn container_wrapper(disk: &Disk, root: &str) -> Vec<String> {
    container_wrapper_as(disk, root, true)
}

/// An emulated container whose init is `sleep`: the placeholder a restore puts a tree into.
struct Placeholder {
    runtime: Child,
    init: u32,
}

impl Placeholder {
    fn start(disk: &Disk, root: &str) -> Placeholder {
        Placeholder::start_with(container_wrapper(disk, root))
    }

    /// A placeholder run by `wrapper`, which must kill its init when it dies (`--kill-child`).
    fn start_with(wrapper: Vec<String>) -> Placeholder {
        let mut runtime = std::process::Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .args(["sleep", "600"])
            .stdin(Stdio::null())
            .spawn()
            .expect("unshare (util-linux)");
        let init = container::wait_for_init(&mut runtime, "sleep", READY_TIMEOUT);
        Placeholder { runtime, init }
    }
}

impl Drop for Placeholder {
    fn drop(&mut self) {
        // --kill-child: the init, and with it everything in its PID namespace, dies with unshare.
        let _ = self.runtime.kill();
        let _ = self.runtime.wait();
    }
}

/// A group in an emulated container (a mount and PID namespace of its own, `pivot_root` into a
/// root of its own, the tool's launcher `cuinterpose run --pid-namespace` as the container's
/// init): the checkpoint, given the container's init as the tool in a pod's node agent is, runs
/// CRIU inside the container and records it; a restore without a container to restore into, or
/// into a process in the tool's root, is refused with nothing changed; restored with
/// `--namespaces-of` the init of another emulated container, every restored process runs over
/// that container's root, the tree's PID namespace below the placeholder's, and the memory and
/// its sharing are intact. A process that is the init of its container (no container around it
/// to run CRIU in) is refused before anything changes, and so is a CRIU that is not the bundled
/// one (it could not be run by descriptor inside the container).
#[test]
fn a_group_in_a_container_is_restored_into_another_container() {
    let disk = Disk::new();
    let wrapper = container_wrapper(&disk, "root-a");
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut group = disk.start_group_under(&[], &wrapper);
    let tree = control::discovery::process_tree(group.launcher.id()).expect("tree");
    // unshare, the container's init (the launcher), the two ranks.
    let (container_init, rank0) = (tree[1], tree[2]);
    assert_ne!(
        root_of(rank0),
        root_of(std::process::id()),
        "the group runs in its own root"
    );

    // A CRIU that is not the bundled one (here a script in front of it) cannot be run by
    // descriptor inside the container: refused, nothing changed.
    let script = disk.env.dir().join("criu");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexec {} \"$@\"\n", disk.criu.display()),
    )
    .expect("a CRIU script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let dir = disk.checkpoint_dir();
    let dir_arg = dir.to_str().expect("utf-8 path");
    let init_arg = container_init.to_string();
    let out = disk.tool(&[
        "checkpoint",
        "--pid",
        &init_arg,
        "--dir",
        dir_arg,
        "--criu",
        script.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is not the bundled CRIU"), "{stderr}");
    assert!(!dir.exists(), "nothing was written");
    group.ranks[0].ok("ping").expect("the group still runs");

    let (report, manifest) = checkpoint_at_and_stop(&disk, &mut group, container_init);
    assert_eq!(
        manifest["criu"]["placement"], "below_container_init",
        "{manifest}"
    );
    assert_eq!(report["placement"], "below_container_init", "{report}");

    let before = hash_dir(&dir);
    let me = std::process::id().to_string();
    for (extra, message) in [
        (&[][..], "was taken in a container"),
        (
            &["--namespaces-of", me.as_str()][..],
            "runs in this tool's root filesystem",
        ),
    ] {
        assert_restore_refused(&disk, extra, message, &before);
    }

    let placeholder = Placeholder::start(&disk, "root-b");
    let target = placeholder.init.to_string();
    let (report, restored) = restore(&disk, &["--namespaces-of", &target]);
    assert_eq!(report["placement"], "below_container_init", "{report}");
    let tree = control::discovery::process_tree(restored.0).expect("restored tree");
    assert_eq!(
        tree.len(),
        2,
        "the two ranks (rank 0 is the root): {tree:?}"
    );
    let placeholder_pid_ns = namespace_inode(placeholder.init, "pid");
    let parent = control::procfs::stat(restored.0)
        .expect("restored root")
        .ppid;
    assert_eq!(
        namespace_inode(parent, "pid"),
        placeholder_pid_ns,
        "the restored tree's PID namespace is below the placeholder's"
    );
    for &pid in &tree {
        assert_eq!(
            root_of(pid),
            root_of(placeholder.init),
            "restored pid {pid} does not run over the placeholder's root"
        );
        assert_ne!(namespace_inode(pid, "pid"), placeholder_pid_ns);
    }
    // A copy of the file kept in the checkpoint (a container's files are its own).
    assert!(
        holds_content(tree[0], b"held by rank 0"),
        "rank 0 holds its file again"
    );
    verify_sharing(&disk.attach(), 1);
    drop(restored);
}

/// A group whose root is its container's own init (an ordinary pod's process: `cuinterpose run`
/// without a PID namespace of its own, as the webhook shapes a container that cannot make one):
/// checkpointed by CRIU from a copy of the container's mount namespace, the container's bind
/// mounts of the node's filesystems recorded as external; restored into another emulated
/// container, the tree runs over that container's root, as the init of a PID namespace of its
/// own, with the mount table it had, its memory and sharing intact. A container to restore into
/// that lacks one of those mounts is refused with nothing changed.
#[test]
fn a_container_init_is_restored_into_another_container() {
    let disk = Disk::new();
    // Each container in network, IPC and UTS namespaces of its own, as a pod's sandbox gives them.
    let in_pod = |wrapper: Vec<String>| -> Vec<String> {
        ["unshare", "--net", "--ipc", "--uts", "--"]
            .map(String::from)
            .into_iter()
            .chain(wrapper)
            .collect()
    };
    let wrapper = in_pod(container_wrapper_as(&disk, "root-a", false));
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let launcher = start_under(
        &disk.env,
        "launcher",
        &disk.listen_dir(),
        (2, "0,1"),
        &[],
        READY_TIMEOUT,
        (&wrapper, &[]),
    );
    let mut group = disk.started(launcher);
    let tree = control::discovery::process_tree(group.launcher.id()).expect("tree");
    // unshare, then rank 0 as the container's init, rank 1 its child.
    let rank0 = tree[1];
    // Not killed with unshare (container_wrapper_as): ended with the test whatever happens.
    let _source = Restored(rank0);
    let ns_pid = |pid: u32| control::discovery::describe(pid).expect("a process").ns_pid;
    assert_eq!(ns_pid(rank0), 1, "rank 0 is its container's init");
    assert_ne!(root_of(rank0), root_of(std::process::id()));
    // Sorted: CRIU mounts in an order of its own.
    let mount_points = |pid: u32| -> Vec<String> {
        let mut points: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .expect("mountinfo")
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .collect();
        points.sort();
        points
    };
    let before = mount_points(rank0);
    // A file held under a deleted name in the container's own shm directory, as a Python
    // semaphore in a pod's /dev/shm: CRIU makes a link remap there, which the tool cannot reach
    // at that path.
    let shm_a = disk.env.dir().join("root-a.shm");
    std::fs::write(shm_a.join("sem.tmp"), b"a semaphore in the pod").expect("a file");
    group.ranks[0]
        .ok("open-fd sem /pod-shm/sem.tmp")
        .expect("open-fd");
    std::fs::hard_link(shm_a.join("sem.tmp"), shm_a.join("sem")).expect("final name");
    std::fs::remove_file(shm_a.join("sem.tmp")).expect("unlinking the temporary name");

    let (report, manifest) = checkpoint_at_and_stop(&disk, &mut group, rank0);
    let remaps = manifest["criu"]["link_remaps"]
        .as_array()
        .expect("link remaps");
    assert_eq!(remaps.len(), 2, "the held files' link remaps: {remaps:?}");
    for remap in remaps {
        let kept = remap["kept_as"].as_str().expect("kept_as");
        assert!(kept.starts_with("remaps/"), "kept as a copy: {remap}");
        assert!(disk.checkpoint_dir().join(kept).is_file(), "{remap}");
    }
    let left_in_shm: Vec<_> = std::fs::read_dir(&shm_a)
        .expect("shm")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left_in_shm, ["sem"], "CRIU's name freed in the container");
    let node_mounts = &manifest["criu"]["placement"]["container_init"]["node_mounts"];
    assert_eq!(
        report["placement"], manifest["criu"]["placement"],
        "{report}"
    );
    let node_mounts: Vec<&str> = node_mounts
        .as_array()
        .unwrap_or_else(|| panic!("no node mounts: {manifest}"))
        .iter()
        .map(|m| m.as_str().expect("a path"))
        .collect();
    let test_dir = disk.env.dir().to_str().expect("utf-8 path").to_string();
    for wanted in ["/usr", "/etc", "/dev", test_dir.as_str()] {
        assert!(node_mounts.contains(&wanted), "{wanted}: {node_mounts:?}");
    }
    assert!(
        !node_mounts
            .iter()
            .any(|m| *m == "/" || m.starts_with("/proc")),
        "the root and the container's own /proc are not the node's: {node_mounts:?}"
    );

    // A container without one of those mounts (here the build's artifacts are not bound into
    // it) cannot take the tree: refused, nothing changed.
    let dir = disk.checkpoint_dir();
    let before_files = hash_dir(&dir);
    let bare_root = disk.env.dir().join("root-bare");
    std::fs::create_dir(&bare_root).expect("a root");
    let bare = Placeholder::start_with(in_pod(container::wrapper(
        &bare_root,
        &[disk.env.dir()],
        &bare_root.with_extension("log"),
        true,
    )));
    let bare_arg = bare.init.to_string();
    assert_restore_refused(
        &disk,
        &["--namespaces-of", &bare_arg],
        "has no mount at",
        &before_files,
    );
    drop(bare);
    // A container without /run, where CRIU mounts its iptables lock to restore a tree into a
    // network namespace: refused, nothing changed.
    let no_run = Placeholder::start_with(in_pod(container_wrapper(&disk, "root-no-run")));
    // (The setup's `mount` left libmount's utab in it.)
    std::fs::remove_dir_all(disk.env.dir().join("root-no-run/run")).expect("removing /run");
    let no_run_arg = no_run.init.to_string();
    assert_restore_refused(
        &disk,
        &["--namespaces-of", &no_run_arg],
        "has no /run directory",
        &before_files,
    );
    drop(no_run);

    let placeholder = Placeholder::start_with(in_pod(container_wrapper(&disk, "root-b")));
    let target = placeholder.init.to_string();
    let (report, restored) = restore(&disk, &["--namespaces-of", &target]);
    assert_eq!(
        report["placement"], manifest["criu"]["placement"],
        "{report}"
    );
    let tree = control::discovery::process_tree(restored.0).expect("restored tree");
    assert_eq!(
        tree.len(),
        2,
        "the two ranks (rank 0 is the root): {tree:?}"
    );
    assert_eq!(
        ns_pid(restored.0),
        1,
        "the restored root is the init of its PID namespace"
    );
    let placeholder_pid_ns = namespace_inode(placeholder.init, "pid");
    for &pid in &tree {
        assert_eq!(
            root_of(pid),
            root_of(placeholder.init),
            "restored pid {pid} does not run over the placeholder's root"
        );
        assert_ne!(namespace_inode(pid, "pid"), placeholder_pid_ns);
        for ns in ["net", "ipc", "uts"] {
            assert_eq!(
                namespace_inode(pid, ns),
                namespace_inode(placeholder.init, ns),
                "restored pid {pid} is not in the placeholder's {ns} namespace"
            );
        }
    }
    assert_eq!(
        mount_points(restored.0),
        before,
        "the restored tree's mount table is the one it had"
    );
    for content in [&b"held by rank 0"[..], b"a semaphore in the pod"] {
        assert!(
            holds_content(tree[0], content),
            "rank 0 holds {:?} again",
            String::from_utf8_lossy(content)
        );
    }
    let shm_b = disk.env.dir().join("root-b.shm");
    assert_eq!(
        std::fs::read_dir(&shm_b).expect("shm").count(),
        0,
        "nothing of the restore is left in the placeholder's shm"
    );
    verify_sharing(&disk.attach(), 1);
}

/// A container's init in a real container (runc, Podman and containerd, over the image
/// scripts/container-runtimes.sh makes; the build's artifacts and the test's directory bound in,
/// as the emulated containers have them): `cuinterpose run` without a PID namespace of its own is
/// the container's init, as in an ordinary pod. Checkpointed by the tool from the host and
/// restored into another container of the same runtime, the tree runs over that container's root,
/// in its namespaces, as the init of a PID namespace of its own, with the mount table it had
/// (the runtime's masked and read-only `/proc` paths, its `/dev` tmpfs, `/dev/shm`, `/dev/mqueue`
/// and cgroup mounts included), a file it held under a deleted name in the container's `/dev/shm`
/// held again, and its memory and sharing intact.
fn a_container_init_in_a_real_container_is_restored(kind: container_runtime::Kind) {
    let Some(runtime) = container_runtime::Runtime::find(kind) else {
        return;
    };
    let disk = Disk::new();
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let (name_a, name_b) = container_names(&disk);
    let _removed_a = container_runtime::Removed::new(&runtime, &name_a);
    let _removed_b = container_runtime::Removed::new(&runtime, &name_b);
    let binds = [disk.env.artifacts().dir(), disk.env.dir()];
    let wrapper = runtime.wrapper(&name_a, &binds, scratch.path());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let launcher = start_under(
        &disk.env,
        "launcher",
        &disk.listen_dir(),
        (2, "0,1"),
        &[],
        READY_TIMEOUT,
        (&wrapper, &[]),
    );
    let mut group = disk.started(launcher);
    let rank0 = runtime.init_pid(&name_a).expect("the container's init");
    let _source = Restored(rank0);
    let ns_pid = |pid: u32| control::discovery::describe(pid).expect("a process").ns_pid;
    assert_eq!(ns_pid(rank0), 1, "rank 0 is its container's init");
    assert_ne!(root_of(rank0), root_of(std::process::id()));
    let before = sorted_mount_points(rank0);
    // The runtime's seccomp filter (Podman's and containerd's; runc's bundle has none).
    let seccomp = |pid: u32| -> String {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        status
            .lines()
            .filter(|l| l.starts_with("Seccomp"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let filtered = seccomp(rank0);
    if kind == container_runtime::Kind::Podman {
        assert!(
            filtered.contains("Seccomp:\t2"),
            "Podman's filter: {filtered}"
        );
    }
    // (`ctr run`'s default spec mounts no cgroup filesystem; runc's and Podman's do.)
    let cgroup_mount = kind != container_runtime::Kind::Containerd;
    let wanted = ["/dev/shm", "/dev/mqueue", "/proc/sys"]
        .into_iter()
        .chain(cgroup_mount.then_some("/sys/fs/cgroup/memory"));
    for wanted in wanted {
        assert!(before.iter().any(|m| m == wanted), "{wanted}: {before:?}");
    }
    // A file held under a deleted name in the container's /dev/shm (the runtime's own), as a
    // Python semaphore: made through the container's root, which the tool reaches as /proc/PID/root.
    let shm_a = PathBuf::from(format!("/proc/{rank0}/root/dev/shm"));
    std::fs::write(shm_a.join("sem.tmp"), b"a semaphore in the container").expect("a file");
    group.ranks[0]
        .ok("open-fd sem /dev/shm/sem.tmp")
        .expect("open-fd");
    std::fs::hard_link(shm_a.join("sem.tmp"), shm_a.join("sem")).expect("final name");
    std::fs::remove_file(shm_a.join("sem.tmp")).expect("unlinking the temporary name");

    // Podman's and containerd's containers are named to the tool by their runtime's names for
    // them (`--container`: it asks the runtime for the init's PID), runc's by the PID. One the
    // runtime does not know is refused (exit 3), named, nothing written.
    if let Some((missing, vars)) = runtime.container_ref(&format!("{name_a}-missing")) {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let dir = disk.env.dir().join("never-written");
        let out = disk.tool_with(
            &[
                "checkpoint",
                "--container",
                &missing,
                "--dir",
                dir.to_str().unwrap(),
            ],
            &vars,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(
            stderr.contains(&format!("container {missing}: ")),
            "{stderr}"
        );
        assert!(!dir.exists());
    }
    let (report, manifest) = match runtime.container_ref(&name_a) {
        Some((container, vars)) => {
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            checkpoint_target_and_stop(&disk, &mut group, &["--container", &container], &vars)
        }
        None => checkpoint_at_and_stop(&disk, &mut group, rank0),
    };
    assert_eq!(report["root"], rank0, "{report}");
    assert_eq!(
        report["placement"], manifest["criu"]["placement"],
        "{report}"
    );
    assert!(
        manifest["criu"]["placement"]["container_init"]["node_mounts"].is_array(),
        "{manifest}"
    );

    let (mut placeholder_client, placeholder) =
        start_placeholder(&runtime, &name_b, &binds, scratch.path());
    let target = placeholder.to_string();
    let (report, restored) = match runtime.container_ref(&name_b) {
        Some((container, vars)) => {
            let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
            restore_with(&disk, &["--container", &container], &vars)
        }
        None => restore(&disk, &["--namespaces-of", &target]),
    };
    assert_eq!(
        report["placement"], manifest["criu"]["placement"],
        "{report}"
    );
    let tree = control::discovery::process_tree(restored.0).expect("restored tree");
    assert_eq!(
        tree.len(),
        2,
        "the two ranks (rank 0 is the root): {tree:?}"
    );
    assert_eq!(
        ns_pid(restored.0),
        1,
        "the restored root is the init of its PID namespace"
    );
    for &pid in &tree {
        assert_eq!(
            root_of(pid),
            root_of(placeholder),
            "restored pid {pid} does not run over the placeholder's root"
        );
        for ns in ["net", "ipc", "uts"] {
            assert_eq!(
                namespace_inode(pid, ns),
                namespace_inode(placeholder, ns),
                "restored pid {pid} is not in the placeholder's {ns} namespace"
            );
        }
    }
    assert_eq!(
        sorted_mount_points(restored.0),
        before,
        "the restored tree's mount table is the one it had"
    );
    // Its output goes where the placeholder's goes: the runtime's pipes (CRIU alone would make
    // new pipes with nobody reading them).
    for fd in [1, 2] {
        let link = |pid: u32| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).expect("an fd");
        let theirs = link(placeholder);
        assert!(theirs.to_string_lossy().starts_with("pipe:"), "{theirs:?}");
        assert_eq!(link(restored.0), theirs, "the restored root's fd {fd}");
    }
    assert_eq!(
        seccomp(restored.0),
        filtered,
        "the restored root's seccomp filter"
    );
    // In the placeholder's cgroups, every hierarchy (the runtime made them in each v1 one).
    let cgroups =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let theirs = cgroups(placeholder);
    assert_ne!(
        theirs,
        cgroups(std::process::id()),
        "the runtime made cgroups of its own"
    );
    for &pid in &tree {
        assert_eq!(
            cgroups(pid),
            theirs,
            "restored pid {pid} is not in the placeholder's cgroups"
        );
    }
    for content in [&b"held by rank 0"[..], b"a semaphore in the container"] {
        assert!(
            holds_content(tree[0], content),
            "rank 0 holds {:?} again",
            String::from_utf8_lossy(content)
        );
    }
    verify_sharing(&disk.attach(), 1);
    drop(restored);
    runtime.remove(&name_b);
    let _ = placeholder_client.wait();
}

/// The mount points of `pid`'s mount table, sorted (CRIU mounts in an order of its own).
fn sorted_mount_points(pid: u32) -> Vec<String> {
    let mut points: Vec<String> = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect();
    points.sort();
    points
}

#[test]
fn a_container_init_in_runc_is_restored_into_another_runc_container() {
    a_container_init_in_a_real_container_is_restored(container_runtime::Kind::Runc);
}

#[test]
fn a_container_init_in_podman_is_restored_into_another_podman_container() {
    a_container_init_in_a_real_container_is_restored(container_runtime::Kind::Podman);
}

/// A group in a real privileged container (runc, Podman and containerd, privileged):
/// `cuinterpose run --pid-namespace` is the container's init and the ranks the init of a PID
/// namespace below it. Checkpointed by the tool from the host given the container's init (CRIU
/// runs inside the container) and restored into another privileged container of the same
/// runtime: the ranks run over that container's root, their PID namespace below the
/// placeholder's, in its cgroups, with memory and sharing intact. Into an unprivileged container
/// (where CRIU inside cannot restore) it is refused with nothing changed.
fn a_group_in_a_real_privileged_container_is_restored(kind: container_runtime::Kind) {
    let Some(runtime) = container_runtime::Runtime::find(kind).map(|r| r.privileged()) else {
        return;
    };
    let disk = Disk::new();
    let scratch = tempfile::tempdir().expect("a scratch directory");
    let (name_a, name_b) = container_names(&disk);
    let _removed_a = container_runtime::Removed::new(&runtime, &name_a);
    let _removed_b = container_runtime::Removed::new(&runtime, &name_b);
    let binds = [disk.env.artifacts().dir(), disk.env.dir()];
    let wrapper = runtime.wrapper(&name_a, &binds, scratch.path());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut group = disk.start_group_under(&[], &wrapper);
    let container_init = runtime.init_pid(&name_a).expect("the container's init");
    let tree = control::discovery::process_tree(container_init).expect("tree");
    assert_eq!(tree.len(), 3, "the launcher and the two ranks: {tree:?}");
    assert_ne!(root_of(tree[1]), root_of(std::process::id()));

    let (report, manifest) = checkpoint_at_and_stop(&disk, &mut group, container_init);
    assert_eq!(
        manifest["criu"]["placement"], "below_container_init",
        "{manifest}"
    );
    assert_eq!(report["placement"], "below_container_init", "{report}");

    // Into an unprivileged container (/proc/sys read-only, where CRIU inside must write):
    // refused, nothing changed.
    let before = hash_dir(&disk.checkpoint_dir());
    let unprivileged = container_runtime::Runtime::find(kind).expect("found above");
    let name_c = format!("{name_a}-unprivileged");
    let _removed_c = container_runtime::Removed::new(&unprivileged, &name_c);
    let (mut client_c, init_c) = start_placeholder(&unprivileged, &name_c, &binds, scratch.path());
    let target_c = init_c.to_string();
    assert_restore_refused(
        &disk,
        &["--namespaces-of", &target_c],
        "mounts /proc/sys read-only",
        &before,
    );
    unprivileged.remove(&name_c);
    let _ = client_c.wait();

    let (mut placeholder_client, placeholder) =
        start_placeholder(&runtime, &name_b, &binds, scratch.path());
    let target = placeholder.to_string();
    let (report, restored) = restore(&disk, &["--namespaces-of", &target]);
    assert_eq!(report["placement"], "below_container_init", "{report}");
    let tree = control::discovery::process_tree(restored.0).expect("restored tree");
    assert_eq!(
        tree.len(),
        2,
        "the two ranks (rank 0 is the root): {tree:?}"
    );
    let placeholder_pid_ns = namespace_inode(placeholder, "pid");
    let parent = control::procfs::stat(restored.0)
        .expect("restored root")
        .ppid;
    assert_eq!(
        namespace_inode(parent, "pid"),
        placeholder_pid_ns,
        "the restored tree's PID namespace is below the placeholder's"
    );
    let cgroups =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    for &pid in &tree {
        assert_eq!(
            root_of(pid),
            root_of(placeholder),
            "restored pid {pid}'s root"
        );
        assert_ne!(namespace_inode(pid, "pid"), placeholder_pid_ns);
        assert_eq!(
            cgroups(pid),
            cgroups(placeholder),
            "restored pid {pid}'s cgroups"
        );
    }
    assert!(
        holds_content(tree[0], b"held by rank 0"),
        "rank 0 holds its file again"
    );
    verify_sharing(&disk.attach(), 1);
    drop(restored);
    runtime.remove(&name_b);
    let _ = placeholder_client.wait();
}

/// Two container names for a test (the runtime's names are machine-wide): unique per test
/// directory.
fn container_names(disk: &Disk) -> (String, String) {
    let unique = disk
        .env
        .dir()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a test directory name")
        .trim_start_matches('.')
        .to_ascii_lowercase();
    (format!("cuit-{unique}-a"), format!("cuit-{unique}-b"))
}

/// A container of `runtime` named `name` whose init is `sleep`, the placeholder a restore puts a
/// tree into: the runtime's client (ended by removing the container) and the init's host PID.
fn start_placeholder(
    runtime: &container_runtime::Runtime,
    name: &str,
    binds: &[&Path],
    scratch: &Path,
) -> (Child, u32) {
    let wrapper = runtime.wrapper(name, binds, scratch);
    let client = std::process::Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .args(["sleep", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the runtime's client");
    let init = runtime.wait_for_init(name, "sleep", READY_TIMEOUT);
    (client, init)
}

#[test]
fn a_group_in_a_privileged_runc_container_is_restored_into_another() {
    a_group_in_a_real_privileged_container_is_restored(container_runtime::Kind::Runc);
}

#[test]
fn a_group_in_a_privileged_podman_container_is_restored_into_another() {
    a_group_in_a_real_privileged_container_is_restored(container_runtime::Kind::Podman);
}

/// Whether `pid` holds open a regular file with exactly `content`.
fn holds_content(pid: u32, content: &[u8]) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .flatten()
        .filter(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| m.is_file()))
        .any(|fd| std::fs::read(fd.path()).is_ok_and(|c| c == content))
}

/// `cuinterpose demo --to-disk --json` gives what the GPU lane reads: `checkpoint.phases` and
/// `restore.phases` (each with `name` and `millis`) and `checkpoint.image_bytes`.
#[test]
fn demo_to_disk_reports_what_the_gpu_lane_reads() {
    let disk = Disk::new();
    let mut command = std::process::Command::new(&disk.tool);
    command
        .args(["demo", "--to-disk", "--fake", "--json", "--size", "4194304"])
        .env("CUINTERPOSE_CRIU", &disk.criu)
        // The demo counts device memory with cuMemGetInfo, which on the fake sees every process of
        // the state directory: a private one keeps other tests' processes out of its figures.
        .env("FAKE_CUDA_STATE_DIR", disk.env.fake_state_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = wait_output(
        command.spawn().expect("starting the demo"),
        TOOL_TIMEOUT,
        "cuinterpose demo --to-disk",
    );
    assert!(
        out.status.success(),
        "demo --to-disk failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    for side in ["checkpoint", "restore"] {
        let phases = report[side]["phases"].as_array().expect("phases");
        assert!(!phases.is_empty());
        for p in phases {
            assert!(p["name"].is_string() && p["millis"].is_number(), "{p}");
        }
    }
    let names = |side: &str| phase_names(&report[side]);
    assert!(names("checkpoint").contains(&"criu-dump".to_string()));
    assert!(names("restore").contains(&"criu-restore".to_string()));
    // The images hold the processes' own memory; the shared GPU bytes are in the data files.
    assert!(
        report["checkpoint"]["image_bytes"]
            .as_u64()
            .expect("image bytes")
            > 0
    );
    assert_eq!(
        report["checkpoint"]["data_bytes"]
            .as_u64()
            .expect("data bytes")
            + report["checkpoint"]["zero_bytes"]
                .as_u64()
                .expect("zero bytes"),
        8 << 20
    );
    assert_eq!(report["group_memory_checkpointed"], 0);
    assert_eq!(
        report["group_memory_restored"],
        report["group_memory_before"]
    );
    assert_eq!(report["verified"].as_array().expect("verified").len(), 4);
}

/// What CRIU cannot work with is refused before anything changes: a workload that is not the root
/// of its own PID namespace, a missing CRIU, a used checkpoint directory.
#[test]
fn checkpoints_criu_cannot_take_are_refused_before_anything_changes() {
    let disk = Disk::new();
    let plain = disk
        .env
        .spawn(testkit::WorkloadOptions::new("plain").shim(true))
        .expect("a workload outside a PID namespace");
    plain.ok("create x 2M").expect("create");
    let dir = disk.checkpoint_dir();
    let dir_arg = dir.to_str().expect("utf-8 path");
    let pid = plain.pid().to_string();
    let out = disk.tool(&["checkpoint", "--pid", &pid, "--dir", dir_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("own PID namespace"), "{stderr}");
    assert!(!dir.exists(), "nothing was written");
    plain.ok("ping").expect("the workload still runs");

    let group = disk.start_group();
    let launcher = group.launcher.id().to_string();
    let out = disk.tool(&[
        "checkpoint",
        "--pid",
        &launcher,
        "--dir",
        dir_arg,
        "--criu",
        "/nonexistent/criu",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("criu not found"), "{stderr}");
    std::fs::create_dir_all(dir.join("images")).expect("mkdir");
    let out = disk.tool(&["checkpoint", "--pid", &launcher, "--dir", dir_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is not empty"), "{stderr}");
    verify_sharing(&group.ranks, 1);
}

/// A dump that fails after the capture (here a CRIU that fails every dump) is rolled back: the
/// workload runs on with its memory and sharing, and no restorable checkpoint is left.
#[test]
fn a_failed_dump_is_rolled_back() {
    use std::os::unix::fs::PermissionsExt;
    let disk = Disk::new();
    let group = disk.start_group();
    let failing = disk.env.dir().join("failing-criu");
    std::fs::write(
        &failing,
        "#!/bin/sh\n\
         [ \"$1\" = --version ] && { echo 'Version: 4.1.1'; exit 0; }\n\
         echo 'Error (test): this CRIU fails every dump' >&2\n\
         exit 1\n",
    )
    .expect("writing the failing CRIU");
    std::fs::set_permissions(&failing, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = disk.checkpoint_dir();
    let launcher = group.launcher.id().to_string();
    let out = disk.tool(&[
        "checkpoint",
        "--pid",
        &launcher,
        "--dir",
        dir.to_str().expect("utf-8 path"),
        "--criu",
        failing.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("this CRIU fails every dump"), "{stderr}");
    assert!(stderr.contains("rolled back"), "{stderr}");
    assert!(!dir.join("manifest.json").exists());
    assert!(!dir.join("cuinterpose.state").exists());
    assert_eq!(disk.usage_table(), [[SIZE[0], 0], [0, SIZE[1]]]);
    verify_sharing(&group.ranks, 1);
}

/// TCP connections (NCCL's bootstrap and proxy connections are): one to a peer outside the group
/// is refused before anything changes; ones between the group's processes are checkpointed and
/// restored established, and carry data both ways afterwards, also the bytes sent but not yet
/// read at the dump.
#[test]
fn tcp_connections_within_the_group_survive_and_outside_peers_are_refused() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    let dir = disk.checkpoint_dir();
    let dir_arg = dir.to_str().expect("utf-8 path");
    let launcher = group.launcher.id().to_string();
    let (rank0, rank1) = (&group.ranks[0], &group.ranks[1]);

    let outside = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let address = outside.local_addr().expect("address").to_string();
    rank0
        .ok(&format!("tcp-connect out {address}"))
        .expect("connect out");
    let (_accepted, _) = outside.accept().expect("accept");
    let out = disk.tool(&["checkpoint", "--pid", &launcher, "--dir", dir_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(&format!("-> {address}")) && stderr.contains("outside the workload"),
        "{stderr}"
    );
    assert!(!dir.exists(), "nothing was written");
    verify_sharing(&group.ranks, 1);
    rank0.ok("close-fd out").expect("close");

    let port = rank0.ok("tcp-listen l").expect("listen").u64("port");
    let port = port.expect("port");
    rank1
        .ok(&format!("tcp-connect c 127.0.0.1:{port}"))
        .expect("connect");
    rank0.ok("tcp-accept s l").expect("accept");
    rank1.ok("tcp-send c queued").expect("send before the dump");

    let (_report, manifest) = checkpoint_and_stop(&disk, &mut group);
    assert_eq!(manifest["criu"]["tcp_established"], true, "{manifest}");
    let (_report, _restored) = restore(&disk, &[]);
    let ranks = disk.attach();
    verify_sharing(&ranks, 3); // the refusal's check left round 3's contents
    let received = |rank: &Workload, socket: &str, len: usize| {
        rank.ok(&format!("tcp-recv {socket} {len}"))
            .expect("receive")
            .str("text")
            .map(str::to_owned)
    };
    assert_eq!(received(&ranks[0], "s", 6).as_deref(), Some("queued"));
    ranks[1].ok("tcp-send c hello").expect("send after restore");
    assert_eq!(received(&ranks[0], "s", 5).as_deref(), Some("hello"));
    ranks[0].ok("tcp-send s back").expect("send back");
    assert_eq!(received(&ranks[1], "c", 4).as_deref(), Some("back"));
}

/// `discard` removes a checkpoint and the link remap it keeps outside its directory; a directory
/// holding anything a checkpoint does not write, or no readable manifest, is refused untouched.
#[test]
fn discard_removes_the_checkpoint_and_its_link_remaps() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let dir = disk.checkpoint_dir();
    let dir_arg = dir.to_str().expect("utf-8 path");
    let kept = disk.link_remaps();
    assert_eq!(kept.len(), 1, "{kept:?}");

    let stranger = dir.join("notes.txt");
    std::fs::write(&stranger, b"mine").expect("write");
    let hashes = hash_dir(&dir);
    let out = disk.tool(&["discard", "--dir", dir_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("notes.txt"), "{stderr}");
    assert_eq!(hash_dir(&dir), hashes, "nothing was removed");
    assert!(kept[0].is_file());
    std::fs::remove_file(&stranger).expect("rm");

    let report = disk.tool_json(&["discard", "--dir", dir_arg]);
    assert!(report["image_bytes"].as_u64().expect("image bytes") > 0);
    assert_eq!(report["link_remaps"].as_array().expect("remaps").len(), 1);
    assert!(!dir.exists(), "the checkpoint directory is gone");
    assert!(!kept[0].exists(), "the kept link remap is gone");
    assert!(
        disk.held_file().is_file(),
        "the file's own name is untouched"
    );

    let out = disk.tool(&["discard", "--dir", dir_arg]);
    assert_eq!(out.status.code(), Some(3), "nothing left to discard");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("manifest.json"), b"{}").expect("write");
    let out = disk.tool(&["discard", "--dir", dir_arg]);
    assert_eq!(out.status.code(), Some(3), "a manifest that does not read");
    assert!(dir.join("manifest.json").is_file());
}

/// Multicast (issue 16) through a checkpoint to disk: the two ranks share a multicast object of
/// rank 0 (added on devices 0 and 1), rank 0 binding a shared member by allocation and rank 1 a
/// private member by address; after checkpoint, exit and restore, writes through either rank's
/// multicast mapping reach both members again, and the rebuild ran its four steps.
#[test]
fn a_multicast_object_survives_checkpoint_to_disk_and_restore() {
    const MC: u64 = 4 << 20;
    let disk = Disk::new();
    let mut group = disk.start_group();
    let ranks = &group.ranks;
    ranks[0]
        .all_ok(&[&format!("mc-create mc {MC} --devices 2"), "export mc"])
        .expect("creating the multicast object");
    ranks[0].ok("send-fd mc --to 1").expect("send-fd");
    ranks[1]
        .all_ok(&["wait fd mc", &format!("import mc --size {MC}")])
        .expect("importing the multicast object");
    for (r, w) in ranks.iter().enumerate() {
        w.ok(&format!("mc-add-device mc --device {r}"))
            .expect("adding a device");
    }
    for (r, w) in ranks.iter().enumerate() {
        let (types, bind) = if r == 0 {
            ("posix", format!("mc-bind-mem mc 0 m --size {MC}"))
        } else {
            ("none", "mc-bind-addr mc 0 m".to_string())
        };
        w.all_ok(&[
            &format!("create m {MC} --device {r} --handle-types {types}"),
            &format!("reserve r-m {MC}"),
            "map m r-m",
            &format!("set-access m --device {r}"),
            &bind,
            &format!("reserve r-mc {MC}"),
            "map mc r-mc",
            &format!("set-access mc --device {r}"),
        ])
        .expect("binding and mapping");
    }
    let through = |ranks: &[Workload], from: usize, seed: u64| {
        ranks[from]
            .ok(&format!("fill mc {seed}"))
            .expect("a write through the multicast mapping");
        for w in ranks {
            w.ok(&format!("verify m {seed}"))
                .expect("the member got it");
        }
    };
    through(&group.ranks, 0, 51);

    let (report, manifest) = checkpoint_and_stop(&disk, &mut group);
    assert!(phase_names(&report).iter().any(|p| p == "criu-dump"));
    let recorded = manifest["participants"]
        .as_array()
        .expect("participants")
        .len();
    assert_eq!(recorded, 2);
    let (report, _restored) = restore(&disk, &[]);
    let phases = phase_names(&report);
    for wanted in [
        "load",
        "import",
        "multicast-create",
        "multicast-import",
        "multicast-add-devices",
        "multicast-bind",
        "verify",
        "thaw",
    ] {
        assert!(phases.iter().any(|p| p == wanted), "{wanted} in {phases:?}");
    }
    let ranks = disk.attach();
    for w in &ranks {
        w.ok("verify m 51").expect("the member kept its bytes");
    }
    through(&ranks, 1, 52);
    through(&ranks, 0, 53);
    verify_sharing(&ranks, 1);
}

/// The same with four ranks on four fake devices: rank 0 creates the multicast object, every
/// rank binds a member of its own device (even ranks by allocation, odd ranks by address), the
/// group is checkpointed to disk, exits, is restored, and a write through each rank's multicast
/// mapping reaches all four members.
#[test]
fn four_ranks_keep_a_multicast_object_through_checkpoint_to_disk_and_restore() {
    const MC: u64 = 4 << 20;
    const N: usize = 4;
    let mut disk = Disk::new();
    disk.env = disk.env.env("FAKE_CUDA_DEVICES", N.to_string());
    let dir = disk.listen_dir();
    let mut launcher = start_namespace(
        &disk.env,
        "launcher",
        &dir,
        (N, "0,1,2,3"),
        &[],
        READY_TIMEOUT,
    );
    let attach = || attach_ranks(&dir, N, "rank", |r| r as i32);
    let ranks = attach();
    ranks[0]
        .all_ok(&[&format!("mc-create mc {MC} --devices {N}"), "export mc"])
        .expect("creating the multicast object");
    for r in 1..N {
        ranks[0]
            .ok(&format!("send-fd mc --to {r}"))
            .expect("send-fd");
        ranks[r]
            .all_ok(&["wait fd mc", &format!("import mc --size {MC}")])
            .expect("importing the multicast object");
    }
    for w in &ranks {
        w.ok("mc-add-device mc").expect("adding a device");
    }
    for (r, w) in ranks.iter().enumerate() {
        let bind = if r % 2 == 0 {
            format!("mc-bind-mem mc 0 m --size {MC}")
        } else {
            "mc-bind-addr mc 0 m".to_string()
        };
        w.all_ok(&[
            &format!("create m {MC} --handle-types posix"),
            &format!("reserve r-m {MC}"),
            "map m r-m",
            "set-access m",
            &bind,
            &format!("reserve r-mc {MC}"),
            "map mc r-mc",
            "set-access mc",
        ])
        .expect("binding and mapping");
    }
    let through = |ranks: &[Workload], from: usize, seed: u64| {
        ranks[from]
            .ok(&format!("fill mc {seed}"))
            .expect("a write through the multicast mapping");
        for w in ranks {
            w.ok(&format!("verify m {seed}"))
                .expect("the member got it");
        }
    };
    through(&ranks, 3, 71);

    let ck = disk.checkpoint_dir();
    let launcher_pid = launcher.id().to_string();
    let report = disk.tool_json(&[
        "checkpoint",
        "--pid",
        &launcher_pid,
        "--dir",
        ck.to_str().expect("utf-8 path"),
    ]);
    assert!(phase_names(&report).iter().any(|p| p == "criu-dump"));
    let status = wait_child(&mut launcher, READY_TIMEOUT);
    assert!(!status.success(), "the workload was killed by CRIU");
    assert!(!disk.group_answers(), "nothing answers after the dump");
    let (report, _restored) = restore(&disk, &[]);
    let phases = phase_names(&report);
    for wanted in [
        "multicast-create",
        "multicast-import",
        "multicast-add-devices",
        "multicast-bind",
    ] {
        assert!(phases.iter().any(|p| p == wanted), "{wanted} in {phases:?}");
    }
    let ranks = attach();
    for w in &ranks {
        w.ok("verify m 71").expect("the member kept its bytes");
    }
    for from in 0..N {
        through(&ranks, from, 80 + from as u64);
    }
}

/// All-zero blocks of GPU memory are neither written nor read: the data file leaves them as
/// holes, the manifest lists them and the report counts them, and the restore sets them to zero.
/// The group runs with pinned carriers kept across two in-place cycles first: a checkpoint to
/// disk after them streams to its data files all the same.
#[test]
fn zero_blocks_are_elided_and_pinned_carriers_still_work() {
    let disk = Disk::new();
    // Holes in a data file (a block store elides the same blocks: store tests below).
    disk.self_contained
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut group = disk.start_group_with(&[("CUINTERPOSE_CARRIER", "pinned")]);
    let launcher = group.launcher.id().to_string();
    for _ in 0..2 {
        disk.tool_json(&["suspend", "--pid", &launcher]);
        disk.tool_json(&["resume", "--pid", &launcher]);
    }
    verify_sharing(&group.ranks, 1);
    // Round 3 left a0 with seed(0, 3); its second 2 MiB block becomes zeros.
    let block = 2u64 << 20;
    group.ranks[0]
        .ok(&format!("memset a0 0 --offset {block} --len {block}"))
        .expect("memset");
    let (report, manifest) = checkpoint_and_stop(&disk, &mut group);
    let rank0 = manifest["data_files"]
        .as_array()
        .expect("data files")
        .iter()
        .find(|d| d["ns_pid"] == 1)
        .expect("rank 0's data file")
        .clone();
    assert_eq!(rank0["zero_blocks"], serde_json::json!([1]), "{rank0}");
    assert_eq!(rank0["written_bytes"], SIZE[0] - block);
    assert_eq!(
        report["zero_bytes"], block,
        "the report says what was saved"
    );
    let path = disk.checkpoint_dir().join("data/gpu-1.data");
    let bytes = std::fs::read(&path).expect("data file");
    assert!(
        bytes[block as usize..].iter().all(|&b| b == 0),
        "the zero block reads as zeros"
    );
    {
        use std::os::unix::fs::MetadataExt;
        let allocated = std::fs::metadata(&path).expect("metadata").blocks() * 512;
        assert!(
            allocated <= SIZE[0] - block,
            "the zero block is a hole: {allocated} bytes allocated"
        );
    }

    // Checked first, then loaded: the data file's runs of blocks and its hole both hash to the
    // manifest's digests.
    let (report, _restored) = restore(&disk, &["--verify-data-first"]);
    assert!(
        report["phases"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["name"] == "verify-data")),
        "{report}"
    );
    assert_eq!(report["zero_bytes"], block);
    let ranks = disk.attach();
    for r in &ranks {
        r.ok(&format!("verify a0 {} --len {block}", seed(0, 3)))
            .expect("the written block is back");
        r.ok(&format!(
            "verify a0 --byte 0 --offset {block} --len {block}"
        ))
        .expect("the zero block is zeros");
        r.assert_pattern("a1", seed(1, 3)).expect("a1 is back");
    }
}

/// A disk that fills up while the shims stream their data files (a small tmpfs mounted for the
/// test) is rolled back: the workload runs on with its memory and sharing, the tool exits 4, and
/// nothing is left in the directory.
#[test]
fn a_full_disk_during_the_checkpoint_is_rolled_back() {
    let disk = Disk::new();
    let mount = disk.env.dir().join("small");
    std::fs::create_dir_all(&mount).expect("mount point");
    // Room for rank 1's data file, not for rank 0's.
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "cuinterpose-test"])
        .arg(&mount)
        .status();
    match mounted {
        Ok(s) if s.success() => {}
        other => {
            eprintln!("skipped: cannot mount a tmpfs here ({other:?}); needs root");
            return;
        }
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.clone());
    let group = disk.start_group();
    let launcher = group.launcher.id().to_string();
    // The block store beside the checkpoint is on the small filesystem too.
    let dir = mount.join("ck");
    let out = disk.tool(&[
        "checkpoint",
        "--pid",
        &launcher,
        "--dir",
        dir.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("rolled back"), "{stderr}");
    assert!(
        stderr.contains("No space left on device"),
        "the cause is named: {stderr}"
    );
    assert!(!dir.exists(), "the checkpoint directory is gone");
    // What the failed checkpoint stored went with it: only the store's lock and its empty
    // sub-directories are left.
    let left: Vec<PathBuf> = listing(&mount)
        .into_keys()
        .filter(|p| !mount.join(p).is_dir())
        .filter(|p| !p.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "left on the filesystem: {left:?}");
    assert_eq!(disk.usage_table(), [[SIZE[0], 0], [0, SIZE[1]]]);
    verify_sharing(&group.ranks, 1);
}

// ---- issue 29: crafted checkpoints (items 4, 5, 6, 8, 9) ----

/// Every path under `dir` with its type and size, links not followed and nothing opened (a FIFO
/// there must not hang the test).
fn listing(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let rel = path.strip_prefix(base).unwrap_or(&path).to_path_buf();
            out.insert(rel, format!("{:?} {}", meta.file_type(), meta.len()));
            if meta.is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// `cuinterpose ARGS`, bounded by `timeout` (a hang fails the test instead of blocking it).
fn tool_within(disk: &Disk, args: &[&str], timeout: Duration) -> Output {
    let mut command = disk.env.command(&disk.tool, false).expect("tool command");
    command
        .args(args)
        .env("CUINTERPOSE_CRIU", &disk.criu)
        .env("CUINTERPOSE_SIGNING_KEY", disk.signing_key())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("starting cuinterpose");
    wait_output(child, timeout, &format!("cuinterpose {}", args.join(" ")))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(status.success());
}

fn mknod_zero(path: &Path) {
    let _ = std::fs::remove_file(path);
    let status = std::process::Command::new("mknod")
        .arg(path)
        .args(["c", "1", "5"])
        .status()
        .expect("mknod");
    assert!(status.success());
}

fn replace_with_symlink(path: &Path, target: &Path) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(path).expect("rm dir");
    } else {
        let _ = std::fs::remove_file(path);
    }
    std::os::unix::fs::symlink(target, path).expect("symlink");
}

/// A crafted checkpoint: what it is, how it is made from a copy of a good one, and a part of the
/// message that refuses it.
type Craft = (&'static str, Box<dyn Fn(&Path)>, &'static str);

/// The first data file of the checkpoint in `dir`.
fn first_data_file(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("data"))
        .expect("data")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    files.into_iter().next().expect("a data file")
}

/// A crafted checkpoint: a copy of `good` at `crafted`, changed by `craft`.
fn crafted_copy(good: &Path, crafted: &Path, craft: &dyn Fn(&Path)) {
    if crafted.exists() {
        std::fs::remove_dir_all(crafted).expect("rm crafted");
    }
    copy_dir(good, crafted);
    craft(crafted);
}

/// Outside files a crafted checkpoint names; each must be left alone.
struct Outside {
    victim: PathBuf,
    /// A directory a symbolic link in a crafted checkpoint points at, holding a file named like
    /// a kept link remap, and a stranger.
    victim_dir: PathBuf,
    kept_like: PathBuf,
}

impl Outside {
    fn new(disk: &Disk) -> Outside {
        let victim = disk.env.dir().join("victim.txt");
        std::fs::write(&victim, b"precious").expect("victim");
        let victim_dir = disk.env.dir().join("victim-dir");
        std::fs::create_dir_all(&victim_dir).expect("victim dir");
        let kept_like = victim_dir.join("link_remap.1.cuinterpose-0123456789abcdef");
        std::fs::write(&kept_like, b"precious too").expect("kept-like");
        std::fs::write(victim_dir.join("pages-1.img"), b"precious three").expect("stranger");
        Outside {
            victim,
            victim_dir,
            kept_like,
        }
    }

    fn assert_untouched(&self, what: &str) {
        assert_eq!(
            std::fs::read(&self.victim).ok().as_deref(),
            Some(&b"precious"[..]),
            "{what}"
        );
        assert_eq!(
            std::fs::read(&self.kept_like).ok().as_deref(),
            Some(&b"precious too"[..]),
            "{what}"
        );
        assert!(self.victim_dir.join("pages-1.img").is_file(), "{what}");
    }
}

/// The crafted checkpoints discard must refuse, each with what the message says.
fn discard_crafts(disk: &Disk, outside: &Outside) -> Vec<Craft> {
    let victim = outside.victim.display().to_string();
    let evil = disk.env.dir().join("evil");
    let _ = std::fs::remove_file(&evil);
    std::os::unix::fs::symlink(&outside.victim_dir, &evil).expect("evil link");
    let marker = |remaps: serde_json::Value| {
        move |d: &Path| {
            std::fs::write(d.join("cuinterpose.incomplete"), remaps.to_string()).expect("marker")
        }
    };
    let victim_dir = outside.victim_dir.clone();
    vec![
        (
            "a marker (beside a complete manifest) naming any file as a kept link remap",
            Box::new(marker(serde_json::json!([{
                "link": disk.env.dir().join("link_remap.1"), "kept_as": victim.clone()
            }]))),
            "is not a name the tool keeps a link remap under",
        ),
        (
            "a marker naming a kept link remap through a symbolic link to another directory",
            Box::new(marker(serde_json::json!([{
                "link": evil.join("link_remap.1"),
                "kept_as": evil.join("link_remap.1.cuinterpose-0123456789abcdef"),
            }]))),
            "reached through a symbolic link",
        ),
        (
            "a manifest naming any file as a kept link remap",
            Box::new(move |d: &Path| {
                let victim = victim.clone();
                edit_manifest(d, |m| {
                    m["criu"]["link_remaps"][0]["kept_as"] = victim.into()
                })
            }),
            "not a link_remap.<id> file",
        ),
        (
            "a manifest naming a user's file as the state file",
            Box::new(|d: &Path| {
                std::fs::write(d.join("notes.txt"), b"mine").expect("notes");
                edit_manifest(d, |m| m["state"]["file"] = "notes.txt".into())
            }),
            "names the state file \"notes.txt\"",
        ),
        (
            "a user file in images/",
            Box::new(|d: &Path| std::fs::write(d.join("images/notes.txt"), b"mine").expect("w")),
            "images/notes.txt",
        ),
        (
            "a user file in data/",
            Box::new(|d: &Path| std::fs::write(d.join("data/notes.txt"), b"mine").expect("w")),
            "data/notes.txt",
        ),
        (
            "a user file in remaps/",
            Box::new(|d: &Path| {
                std::fs::create_dir_all(d.join("remaps")).expect("mkdir");
                std::fs::write(d.join("remaps/link_remap.3"), b"mine").expect("w")
            }),
            "remaps/link_remap.3",
        ),
        (
            "a user file named like a temporary of the manifest",
            Box::new(|d: &Path| {
                std::fs::write(d.join(".manifest.json.tmp-mine"), b"mine").expect("w")
            }),
            ".manifest.json.tmp-mine",
        ),
        (
            "the same in an incomplete checkpoint",
            Box::new(|d: &Path| {
                std::fs::write(d.join("cuinterpose.incomplete"), b"[]").expect("marker");
                std::fs::write(d.join(".manifest.json.tmp-mine"), b"mine").expect("w")
            }),
            ".manifest.json.tmp-mine",
        ),
        (
            "images/ a symbolic link to another directory",
            Box::new(move |d: &Path| replace_with_symlink(&d.join("images"), &victim_dir)),
            "images (a symbolic link)",
        ),
        (
            "an image a symbolic link",
            Box::new(|d: &Path| {
                let image = largest_image(d);
                replace_with_symlink(&image, Path::new("/etc/hostname"))
            }),
            "(a symbolic link)",
        ),
        (
            "a data file a FIFO",
            Box::new(|d: &Path| mkfifo(&first_data_file(d))),
            "(a FIFO)",
        ),
        (
            "the state file a device",
            Box::new(|d: &Path| mknod_zero(&d.join("cuinterpose.state"))),
            "cuinterpose.state (a device)",
        ),
    ]
}

/// Items 4, 5 and 9 of issue 29: nothing read from a checkpoint (a marker, a manifest) makes
/// `discard` or `checkpoint --dir` delete anything outside what a checkpoint writes, a user's
/// file in any subdirectory or beside it makes discard refuse before it deletes anything, and so
/// does a directory reached through a symbolic link.
#[test]
fn crafted_checkpoints_make_discard_and_checkpoint_touch_nothing_outside() {
    let disk = Disk::new();
    // What is refused of data files in the directory (the block store's: store tests below).
    disk.self_contained
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let good = disk.checkpoint_dir();
    let kept = disk.link_remaps();
    let outside = Outside::new(&disk);
    let crafted = disk.env.dir().join("crafted");
    let crafted_arg = crafted.to_str().expect("utf-8 path");
    for (what, craft, message) in discard_crafts(&disk, &outside) {
        crafted_copy(&good, &crafted, &*craft);
        let before = listing(&crafted);
        let out = tool_within(
            &disk,
            &["discard", "--dir", crafted_arg],
            Duration::from_secs(60),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{what}: {stderr}");
        assert!(
            stderr.contains(message),
            "{what}: {message:?} not in {stderr}"
        );
        assert!(stderr.contains("nothing was removed"), "{what}: {stderr}");
        assert_eq!(listing(&crafted), before, "{what}: the directory changed");
        outside.assert_untouched(what);
        assert!(
            kept.iter().all(|k| k.is_file()),
            "{what}: the real link remap is gone"
        );
    }

    // Through a symbolic link to a checkpoint: refused, the checkpoint left whole.
    crafted_copy(&good, &crafted, &|_| {});
    let link = disk.env.dir().join("link-to-crafted");
    std::os::unix::fs::symlink(&crafted, &link).expect("symlink");
    let before = listing(&crafted);
    let out = disk.tool(&["discard", "--dir", link.to_str().expect("utf-8")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("is a symbolic link, not a directory"),
        "{stderr}"
    );
    assert!(!stderr.contains("state file"), "{stderr}");
    assert_eq!(listing(&crafted), before);

    // `checkpoint --dir` removes an incomplete checkpoint first: a crafted marker there is
    // refused the same way, before the group is touched.
    let (_report, restored) = restore(&disk, &[]);
    let victim = outside.victim.display().to_string();
    crafted_copy(&good, &crafted, &|d: &Path| {
        let marker = serde_json::json!([{"link": "/tmp/link_remap.1", "kept_as": victim}]);
        std::fs::write(d.join("cuinterpose.incomplete"), marker.to_string()).expect("marker")
    });
    let root = restored.0.to_string();
    let out = disk.tool(&["checkpoint", "--pid", &root, "--dir", crafted_arg]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is not a name the tool keeps"), "{stderr}");
    outside.assert_untouched("checkpoint --dir over a crafted marker");
    verify_sharing(&disk.attach(), 1);
}

/// Item 6 of issue 29: what may stand in every place of a checkpoint instead of the file a
/// checkpoint wrote (a FIFO, a device, a symbolic link), each with a part of the message.
fn restore_crafts() -> Vec<Craft> {
    vec![
        (
            "manifest a FIFO",
            Box::new(|d: &Path| mkfifo(&d.join("manifest.json"))),
            "a FIFO",
        ),
        (
            "manifest a symbolic link",
            Box::new(|d: &Path| {
                let aside = d.with_extension("manifest");
                std::fs::rename(d.join("manifest.json"), &aside).expect("mv");
                replace_with_symlink(&d.join("manifest.json"), &aside)
            }),
            "a symbolic link",
        ),
        (
            "state file a FIFO",
            Box::new(|d: &Path| mkfifo(&d.join("cuinterpose.state"))),
            "a FIFO",
        ),
        (
            "state file a device",
            Box::new(|d: &Path| mknod_zero(&d.join("cuinterpose.state"))),
            "a device",
        ),
        (
            "digest list a FIFO",
            Box::new(|d: &Path| mkfifo(&d.join("images.b3"))),
            "a FIFO",
        ),
        (
            "an image a FIFO",
            Box::new(|d: &Path| mkfifo(&largest_image(d))),
            "a FIFO",
        ),
        (
            "an image a device",
            Box::new(|d: &Path| mknod_zero(&largest_image(d))),
            "a device",
        ),
        (
            "an image a symbolic link",
            Box::new(|d: &Path| {
                let image = largest_image(d);
                let aside = d.with_extension("image");
                std::fs::rename(&image, &aside).expect("mv");
                replace_with_symlink(&image, &aside)
            }),
            "a symbolic link",
        ),
        (
            "images/ a symbolic link",
            Box::new(|d: &Path| {
                let aside = d.with_extension("images");
                std::fs::rename(d.join("images"), &aside).expect("mv");
                replace_with_symlink(&d.join("images"), &aside)
            }),
            "a symbolic link",
        ),
        (
            "a data file a FIFO",
            Box::new(|d: &Path| mkfifo(&first_data_file(d))),
            "a FIFO",
        ),
        (
            "a data file a device",
            Box::new(|d: &Path| mknod_zero(&first_data_file(d))),
            "a device",
        ),
        (
            "a data file a symbolic link",
            Box::new(|d: &Path| {
                let file = first_data_file(d);
                let aside = d.with_extension("data");
                std::fs::rename(&file, &aside).expect("mv");
                replace_with_symlink(&file, &aside)
            }),
            "a symbolic link",
        ),
        (
            "data/ a symbolic link",
            Box::new(|d: &Path| {
                let aside = d.with_extension("datadir");
                std::fs::rename(d.join("data"), &aside).expect("mv");
                replace_with_symlink(&d.join("data"), &aside)
            }),
            "a symbolic link",
        ),
    ]
}

/// A CRIU that runs the real one, except that every restore fails after writing its log, as a
/// CRIU that cannot restore the tree does.
fn criu_failing_restore(disk: &Disk) -> PathBuf {
    let path = disk.env.dir().join("criu-failing-restore");
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = restore ]; then\n  while [ $# -gt 0 ]; do\n    \
         [ \"$1\" = --work-dir ] && dir=$2\n    shift\n  done\n  \
         echo 'Error (criu/cr-restore.c:1): injected restore failure' > \"$dir/restore.log\"\n  \
         exit 1\nfi\nexec {} \"$@\"\n",
        disk.criu.display()
    );
    std::fs::write(&path, script).expect("script");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path
}

/// Items 6 and 8 of issue 29: a FIFO, a device or a symbolic link in any place of a checkpoint
/// is refused (exit 3) without waiting, with and without `--verify-data-first`, and nothing
/// changes; a CRIU that fails the restore exits 4 naming a log that is still there; then the
/// intact checkpoint restores.
#[test]
fn fifos_devices_and_links_in_a_checkpoint_are_refused_and_a_criu_failure_keeps_its_log() {
    let disk = Disk::new();
    // What is refused of data files in the directory (the block store's: store tests below).
    disk.self_contained
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let good = disk.checkpoint_dir();
    let crafted = disk.env.dir().join("crafted");
    let crafted_arg = crafted.to_str().expect("utf-8 path");
    for (what, craft, message) in restore_crafts() {
        crafted_copy(&good, &crafted, &*craft);
        let before = listing(&crafted);
        for extra in [&[][..], &["--verify-data-first"][..]] {
            let mut args = vec!["restore", "--dir", crafted_arg];
            args.extend_from_slice(extra);
            let out = tool_within(&disk, &args, Duration::from_secs(60));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(3), "{what} {extra:?}: {stderr}");
            assert!(
                stderr.contains(message),
                "{what}: {message:?} not in {stderr}"
            );
            assert_eq!(
                stderr.matches(message).count(),
                1,
                "{what}: cause repeated: {stderr}"
            );
            assert_eq!(listing(&crafted), before, "{what}: the directory changed");
            assert!(!disk.group_answers(), "{what}: something was restored");
        }
    }
    std::fs::remove_dir_all(&crafted).expect("rm crafted");

    let before = hash_dir(&good);
    let failing = criu_failing_restore(&disk);
    let out = disk.tool(&[
        "restore",
        "--dir",
        good.to_str().expect("utf-8"),
        "--criu",
        failing.to_str().expect("utf-8"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("injected restore failure"), "{stderr}");
    let log = stderr
        .split("its log is kept at ")
        .nth(1)
        .and_then(|rest| rest.split(":\n").next())
        .unwrap_or_else(|| panic!("no log named: {stderr}"));
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    assert!(text.contains("injected restore failure"), "{text}");
    assert_eq!(hash_dir(&good), before, "the checkpoint is unchanged");
    assert!(!disk.group_answers());

    let (_report, _restored) = restore(&disk, &[]);
    verify_sharing(&disk.attach(), 1);
}

/// Issue 29, "go beyond": a checkpoint is signed with the node's key (made by the first
/// checkpoint, mode 0600); a page image edited together with its digest line, a signature
/// removed, or a checkpoint signed with another key are refused (exit 3) before anything
/// changes; `--allow-unsigned` restores an unsigned one; the intact one restores.
#[test]
fn tampered_unsigned_and_foreign_checkpoints_are_refused_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    let disk = Disk::new();
    let mut group = disk.start_group();
    checkpoint_and_stop(&disk, &mut group);
    let good = disk.checkpoint_dir();
    assert!(good.join("manifest.sig").is_file());
    let mode = std::fs::metadata(disk.signing_key())
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let crafted = disk.env.dir().join("crafted");
    let crafted_arg = crafted.to_str().expect("utf-8 path");
    let refused = |extra: &[&str], message: &str, what: &str| {
        let before = hash_dir(&crafted);
        let mut args = vec!["restore", "--dir", crafted_arg];
        args.extend_from_slice(extra);
        let out = disk.tool(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{what}: {stderr}");
        assert!(
            stderr.contains(message),
            "{what}: {message:?} not in {stderr}"
        );
        assert_eq!(hash_dir(&crafted), before, "{what}: the directory changed");
        assert!(!disk.group_answers(), "{what}: something was restored");
    };

    // A page image edited with its digest line: the digests agree, the signature does not.
    crafted_copy(&good, &crafted, &|d: &Path| {
        let image = largest_image(d);
        flip_byte(&image);
        let name = image
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        let digest = blake3::hash(&std::fs::read(&image).expect("image"))
            .to_hex()
            .to_string();
        let list = std::fs::read_to_string(d.join("images.b3")).expect("list");
        let edited: String = list
            .lines()
            .map(|l| {
                if l.ends_with(&format!("images/{name}")) {
                    format!("{digest}  images/{name}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        std::fs::write(d.join("images.b3"), edited).expect("list");
    });
    refused(
        &[],
        "changed after it was signed",
        "image and digest edited",
    );

    // Another node's key.
    crafted_copy(&good, &crafted, &|_| {});
    let other = disk.env.dir().join("other.key");
    std::fs::write(&other, format!("{}\n", "ab".repeat(32))).expect("key");
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let out = disk.tool_with(
        &["restore", "--dir", crafted_arg],
        &[("CUINTERPOSE_SIGNING_KEY", other.to_str().expect("utf-8"))],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("is signed with key"), "{stderr}");

    // Unsigned: refused, then restored when allowed.
    std::fs::remove_file(crafted.join("manifest.sig")).expect("rm sig");
    refused(&[], "is not signed", "unsigned");
    std::fs::remove_dir_all(&good).expect("rm good");
    std::fs::rename(&crafted, &good).expect("mv");
    let (_report, restored) = restore(&disk, &["--allow-unsigned"]);
    verify_sharing(&disk.attach(), 1);
    drop(restored);
}

#[test]
fn a_container_init_in_containerd_is_restored_into_another_containerd_container() {
    a_container_init_in_a_real_container_is_restored(container_runtime::Kind::Containerd);
}

#[test]
fn a_group_in_a_privileged_containerd_container_is_restored_into_another() {
    a_group_in_a_real_privileged_container_is_restored(container_runtime::Kind::Containerd);
}

// ---- issue 30: the block store beside the checkpoints ----

/// The block size of the store (and of zero blocks).
const BLOCK: u64 = 2 << 20;

/// The block store of the checkpoints in the test's directory.
fn store_dir(disk: &Disk) -> PathBuf {
    disk.env
        .dir()
        .canonicalize()
        .expect("test dir")
        .join(".cuinterpose-blocks")
}

/// The files of the blocks a manifest's data-file entry lists.
fn block_paths(disk: &Disk, entry: &serde_json::Value) -> Vec<PathBuf> {
    let store = store_dir(disk);
    entry["blocks"]
        .as_array()
        .expect("a block list")
        .iter()
        .map(|d| {
            let d = d.as_str().expect("digest");
            store.join(&d[..2]).join(d)
        })
        .collect()
}

/// The names of the blocks in the store.
fn stored_blocks(disk: &Disk) -> Vec<String> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(store_dir(disk)).expect("store").flatten() {
        if !sub.path().is_dir() {
            continue;
        }
        for block in std::fs::read_dir(sub.path()).expect("sub").flatten() {
            out.push(block.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

/// `cuinterpose checkpoint --pid PID --dir DIR EXTRA --json`, which must succeed.
fn checkpoint_into(disk: &Disk, pid: u32, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let pid = pid.to_string();
    let mut args = vec![
        "checkpoint",
        "--pid",
        &pid,
        "--dir",
        dir.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(extra);
    disk.tool_json(&args)
}

fn manifest_of(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
        .expect("manifest JSON")
}

/// Blocks alike in two processes (replicas) and within one are stored once; a second checkpoint
/// of the unchanged group writes no block, a third after a change writes only the changed one;
/// `discard` removes the blocks no other checkpoint references and keeps the rest, from which
/// the first checkpoint restores.
#[test]
fn blocks_are_shared_within_and_across_checkpoints_and_discard_keeps_what_is_referenced() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    let launcher = group.launcher.id();
    // Every block holds the same bytes: rank 0's two, rank 1's one.
    group.ranks[0]
        .ok(&format!("memset a0 7 --offset 0 --len {}", SIZE[0]))
        .expect("memset");
    group.ranks[1]
        .ok(&format!("memset a1 7 --offset 0 --len {}", SIZE[1]))
        .expect("memset");
    let first_dir = disk.checkpoint_dir();
    let first = checkpoint_into(&disk, launcher, &first_dir, &["--leave-running"]);
    assert_eq!(first["data_bytes"], BLOCK, "one block written: {first}");
    assert_eq!(first["shared_bytes"], 2 * BLOCK, "two referenced: {first}");
    assert_eq!(first["zero_bytes"], 0);
    assert_eq!(stored_blocks(&disk).len(), 1);
    let manifest = manifest_of(&first_dir);
    for entry in manifest["data_files"].as_array().expect("data files") {
        for path in block_paths(&disk, entry) {
            assert!(path.is_file(), "{} is stored", path.display());
        }
    }

    let second_dir = disk.env.dir().join("ck2");
    let second = checkpoint_into(&disk, launcher, &second_dir, &["--leave-running"]);
    assert_eq!(
        second["data_bytes"], 0,
        "nothing changed, nothing written: {second}"
    );
    assert_eq!(second["shared_bytes"], SIZE[0] + SIZE[1]);
    assert_eq!(stored_blocks(&disk).len(), 1);

    group.ranks[0]
        .ok(&format!("memset a0 9 --offset {BLOCK} --len {BLOCK}"))
        .expect("change a block");
    let third_dir = disk.env.dir().join("ck3");
    let third = checkpoint_into(&disk, launcher, &third_dir, &[]);
    wait_child(&mut group.launcher, READY_TIMEOUT);
    assert_eq!(
        third["data_bytes"], BLOCK,
        "only the changed block: {third}"
    );
    assert_eq!(third["shared_bytes"], 2 * BLOCK);
    assert_eq!(stored_blocks(&disk).len(), 2);

    // The third's own block goes; the one the others reference stays.
    let report = disk.tool_json(&["discard", "--dir", third_dir.to_str().expect("utf-8")]);
    assert_eq!(report["store"]["blocks"], 1, "{report}");
    assert_eq!(report["store"]["bytes"], BLOCK, "{report}");
    assert_eq!(stored_blocks(&disk).len(), 1);
    let report = disk.tool_json(&["discard", "--dir", second_dir.to_str().expect("utf-8")]);
    assert_eq!(
        report["store"]["blocks"], 0,
        "still referenced by the first: {report}"
    );
    assert_eq!(stored_blocks(&disk).len(), 1);

    let (report, _restored) = restore(&disk, &[]);
    assert_eq!(report["data_bytes"], SIZE[0] + SIZE[1], "{report}");
    let ranks = disk.attach();
    ranks[0]
        .ok(&format!("verify a0 --byte 7 --offset 0 --len {}", SIZE[0]))
        .expect("a0 back from the store");
    ranks[1]
        .ok(&format!("verify a1 --byte 7 --offset 0 --len {}", SIZE[1]))
        .expect("a1 back from the store");
}

/// A block missing, cut short or changed, and a manifest naming a block outside the store: a
/// restore refuses each before anything changes (exit 3), or undoes itself when a changed block
/// is found while loading (exit 4); the checkpoint and the store are unchanged and restore again.
#[test]
fn damaged_missing_and_crafted_blocks_are_refused_and_change_nothing() {
    let disk = Disk::new();
    let mut group = disk.start_group();
    let (_, manifest) = checkpoint_and_stop(&disk, &mut group);
    let good = disk.checkpoint_dir();
    let store = store_dir(&disk);
    let rank0 = manifest["data_files"]
        .as_array()
        .expect("data files")
        .iter()
        .find(|d| d["ns_pid"] == 1)
        .expect("rank 0")
        .clone();
    let block = block_paths(&disk, &rank0).remove(0);
    let original = std::fs::read(&block).expect("block");
    let refused = |dir: &Path, extra: &[&str], code: i32, message: &str, what: &str| {
        let (before, stored) = (hash_dir(dir), hash_dir(&store));
        let mut args = vec!["restore", "--dir", dir.to_str().expect("utf-8 path")];
        args.extend_from_slice(extra);
        let out = disk.tool(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{what}: {stderr}");
        assert!(
            stderr.contains(message),
            "{what}: {message:?} not in {stderr}"
        );
        assert_eq!(hash_dir(dir), before, "{what}: the checkpoint changed");
        assert_eq!(hash_dir(&store), stored, "{what}: the store changed");
        assert!(!disk.group_answers(), "{what}: something was restored");
    };

    let aside = disk.env.dir().join("aside");
    std::fs::rename(&block, &aside).expect("mv");
    refused(&good, &[], 3, "No such file", "a block missing");
    std::fs::rename(&aside, &block).expect("mv back");

    truncate(&block);
    refused(
        &good,
        &[],
        3,
        "is not a regular file of",
        "a block cut short",
    );
    std::fs::write(&block, &original).expect("put back");

    flip_byte(&block);
    refused(
        &good,
        &["--verify-data-first"],
        3,
        "does not hash to its name",
        "a block changed, checked first",
    );
    refused(&good, &[], 4, "the block is damaged", "a block changed");
    std::fs::write(&block, &original).expect("put back");

    // A manifest naming a block by a path: refused whatever the signature says, by restore and
    // by discard, and nothing outside the store is read or removed.
    let crafted = disk.env.dir().join("crafted");
    copy_dir(&good, &crafted);
    let outside = disk.env.dir().join("outside.txt");
    std::fs::write(&outside, b"not a block").expect("outside");
    edit_manifest(&crafted, |m| {
        m["data_files"][0]["blocks"][0] = "../../outside.txt".into();
    });
    refused(
        &crafted,
        &["--allow-unsigned"],
        3,
        "is not a BLAKE3 digest",
        "a block outside the store",
    );
    let out = disk.tool(&["discard", "--dir", crafted.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(outside.is_file(), "nothing outside the store removed");
    std::fs::remove_dir_all(&crafted).expect("rm crafted");

    let (_report, _restored) = restore(&disk, &["--verify-data-first"]);
    verify_sharing(&disk.attach(), 1);
}

/// Two groups checkpointed into one store at once, with a `discard` of an older checkpoint in
/// that store running beside them: each checkpoint is complete with every block it references,
/// and only the older checkpoint's own block is collected.
#[test]
fn two_checkpoints_into_one_store_at_once_and_a_discard_beside_them() {
    let disk = Disk::new();
    let other = Disk::new();
    let group = disk.start_group();
    let mut other_group = other.start_group();
    let launcher = group.launcher.id();
    let old_dir = disk.env.dir().join("old");
    checkpoint_into(&disk, launcher, &old_dir, &["--leave-running"]);
    let old = manifest_of(&old_dir);
    let old_only: Vec<PathBuf> = block_paths(&disk, &old["data_files"][0]);
    // Rank 0's blocks change, and the other group's differ from both: the old checkpoint's
    // rank 0 blocks are its own from now on.
    group.ranks[0]
        .ok(&format!("fill a0 {}", seed(0, 7)))
        .expect("fill");
    other_group.ranks[0]
        .ok(&format!("fill a0 {}", seed(0, 8)))
        .expect("fill");

    let (a_dir, b_dir) = (disk.env.dir().join("a"), disk.env.dir().join("b"));
    let other_launcher = other_group.launcher.id();
    std::thread::scope(|s| {
        let a = s.spawn(|| checkpoint_into(&disk, launcher, &a_dir, &["--leave-running"]));
        let b = s.spawn(|| checkpoint_into(&other, other_launcher, &b_dir, &[]));
        let discarded =
            s.spawn(|| disk.tool_json(&["discard", "--dir", old_dir.to_str().expect("utf-8")]));
        a.join().expect("checkpoint a");
        b.join().expect("checkpoint b");
        let report = discarded.join().expect("discard");
        assert!(report["store"].is_object(), "collected: {report}");
    });
    wait_child(&mut other_group.launcher, READY_TIMEOUT);
    for dir in [&a_dir, &b_dir] {
        let manifest = manifest_of(dir);
        for entry in manifest["data_files"].as_array().expect("data files") {
            for path in block_paths(&disk, entry) {
                let bytes = std::fs::read(&path).expect("a referenced block is kept");
                assert_eq!(
                    blake3::hash(&bytes).to_hex().as_str(),
                    path.file_name().expect("name").to_str().expect("utf-8"),
                    "{} is whole",
                    path.display()
                );
            }
        }
    }
    for path in old_only {
        assert!(
            !path.exists(),
            "{} was the old checkpoint's alone",
            path.display()
        );
    }
    // The second group's checkpoint restores from the shared store.
    let out = other.tool(&["restore", "--dir", b_dir.to_str().expect("utf-8"), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    // Not a child of the test: killed at its end, passed or failed.
    let _restored = Restored(report["root"].as_u64().expect("restored root") as u32);
    for r in other.attach() {
        r.assert_pattern("a0", seed(0, 8)).expect("a0 back");
        r.assert_pattern("a1", seed(1, 1)).expect("a1 back");
    }
}
