//! Emulated containers, for tests of trees in containers: no container runtime can run on the
//! project's machines, so a container is made here as runc makes one. `unshare --mount --pid
//! --fork` (private propagation) runs [`SCRIPT`], which prepares a root directory with bind
//! mounts of the host's system directories and of the directories the test names, at their own
//! paths (so sockets, logs and checkpoints are where the test looks), the directories an image
//! has (`/proc`, `/tmp`, `/run`), and `<root>.shm` at
//! `/pod-shm` (a directory of the container's own that the tool does not see at that path, as a
//! pod's `/dev/shm`); `pivot_root`s into it, mounts a fresh `/proc` for the new PID namespace,
//! drops the old root, opens its standard input and output again inside and closes every other
//! descriptor (a runtime gives the container its own), and execs the command as the container's
//! init in a new session, as a runtime does.

use control::container::RootDir;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// The container's setup, run by bash (it closes descriptors above 9, which dash cannot name):
/// `$1` the root, `$2` the log (in a bound directory), then the directories to bind up to `--`,
/// then the command.
pub const SCRIPT: &str = r#"set -e
root=$1; log=$2; shift 2
binds=()
while [ "$1" != -- ]; do binds+=("$1"); shift; done
shift
mount --bind "$root" "$root"
for d in bin lib lib64 sbin; do
    if [ -L "/$d" ]; then ln -sfn "$(readlink "/$d")" "$root/$d";
    elif [ -d "/$d" ]; then mkdir -p "$root/$d"; mount --rbind "/$d" "$root/$d"; fi
done
for d in /usr /etc /dev; do mkdir -p "$root$d"; mount --rbind "$d" "$root$d"; done
for d in "${binds[@]}"; do mkdir -p "$root$d"; mount --bind "$d" "$root$d"; done
mkdir -p "$root.shm" "$root/pod-shm"; mount --bind "$root.shm" "$root/pod-shm"
mkdir -p "$root/proc" "$root/tmp" "$root/run" "$root/.old-root"
cd "$root"
pivot_root . .old-root
cd /
mount -t proc proc /proc
umount -l /.old-root
rmdir /.old-root
exec </dev/null >>"$log" 2>&1
for fd in $(ls /proc/self/fd); do [ "$fd" -gt 2 ] && eval "exec $fd<&-" 2>/dev/null; done
exec setsid "$@"
"#;

/// The program and arguments that run a command (appended after them) as the init of a new
/// emulated container over `root` (an existing directory), with `binds` bound in and its output
/// appended to `log`. `kill_with_runtime`: the init dies with `unshare` (`--kill-child`), for a
/// placeholder; not for a container whose init a test checkpoints, since `--kill-child` gives the
/// init a parent-death signal, which CRIU dumps and a restored tree would receive as soon as CRIU
/// exits (a runtime gives its init none).
pub fn wrapper(root: &Path, binds: &[&Path], log: &Path, kill_with_runtime: bool) -> Vec<String> {
    let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
    let mut words: Vec<String> = ["unshare", "--mount", "--pid", "--fork"]
        .map(String::from)
        .to_vec();
    if kill_with_runtime {
        words.push("--kill-child".into());
    }
    words.extend(
        [
            "--propagation",
            "private",
            "--",
            "bash",
            "-c",
            SCRIPT,
            "container",
        ]
        .map(String::from),
    );
    words.push(path(root));
    words.push(path(log));
    words.extend(binds.iter().map(|b| path(b)));
    words.push("--".into());
    words
}

/// The root directory of `pid`, by device and inode.
pub fn root_of(pid: u32) -> RootDir {
    control::container::root_dir(Some(pid)).unwrap_or_else(|e| panic!("root of pid {pid}: {e}"))
}

/// The container's init under `runtime` (the process that runs [`wrapper`], or one that execs
/// it), once it has pivoted into its root and execed `program`.
pub fn wait_for_init(runtime: &mut Child, program: &str, timeout: Duration) -> u32 {
    let deadline = Instant::now() + timeout;
    let ours = root_of(std::process::id());
    let mut wanted = program.as_bytes().to_vec();
    wanted.push(0);
    loop {
        let init = control::discovery::process_tree(runtime.id())
            .ok()
            .and_then(|tree| {
                tree.into_iter().skip(1).find(|&pid| {
                    control::container::root_dir(Some(pid)).is_ok_and(|r| r != ours)
                        && std::fs::read(format!("/proc/{pid}/cmdline"))
                            .is_ok_and(|c| c.starts_with(&wanted))
                })
            });
        if let Some(init) = init {
            return init;
        }
        if let Ok(Some(status)) = runtime.try_wait() {
            panic!("the emulated container exited: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the emulated container did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
