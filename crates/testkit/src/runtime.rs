//! Real container runtimes for tests of trees in containers: runc and Podman, as
//! `scripts/container-runtimes.sh` installs them, over the image it makes (busybox-static, with
//! `/lib` and `/lib64` linked into `/usr`; the host's `/usr` is bound read-only over the image's so
//! that the build's glibc programs run, as the emulated containers of [`crate::container`] bind the
//! host's system directories). The directories a test names are bound at their own paths (sockets,
//! logs, checkpoints where the test looks).
//!
//! A test that needs a runtime asks [`Runtime::find`]: `None` (the test skips, saying so) where the
//! runtime or the image is missing, unless `CI=true` or `CUINTERPOSE_TEST_RUNTIMES=required`
//! (scripts/test.sh sets it after installing them), where a missing runtime fails the test: a
//! skip there would hide a broken setup.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Which runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// runc itself: `runc run` of a bundle made from the image's root directory.
    Runc,
    /// Podman with runc (`--runtime runc`: Debian's crun is built without CRIU).
    Podman,
    /// containerd (its runc shim, `io.containerd.runc.v2`) through `ctr run`, the containerd
    /// scripts/container-runtimes.sh starts (`CUINTERPOSE_TEST_CONTAINERD`, its socket).
    Containerd,
}

/// A runtime found on this machine, with the image its containers run.
#[derive(Debug, Clone)]
pub struct Runtime {
    kind: Kind,
    program: PathBuf,
    /// runc: the image's root directory; Podman: unused (the image is imported).
    rootfs: PathBuf,
    /// Podman and containerd: the image's name.
    image: String,
    /// containerd: its socket.
    address: PathBuf,
    /// Podman: the options every `podman run` needs on these machines.
    podman_args: Vec<String>,
    /// Privileged containers ([`Runtime::privileged`]).
    privileged: bool,
}

/// Settings as scripts/container-runtimes.sh prints them, with the same defaults.
fn setting(var: &str, default: impl FnOnce() -> String) -> String {
    std::env::var(var)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(default)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

impl Runtime {
    /// The runtime `kind`, or `None` when it or its image is missing (a skip; a panic where
    /// they are required, as the module says).
    pub fn find(kind: Kind) -> Option<Runtime> {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let rootfs = PathBuf::from(setting("CUINTERPOSE_TEST_ROOTFS", || {
            repo.join(".containers/rootfs").display().to_string()
        }));
        let (var, name) = match kind {
            Kind::Runc => ("CUINTERPOSE_TEST_RUNC", "runc"),
            Kind::Podman => ("CUINTERPOSE_TEST_PODMAN", "podman"),
            Kind::Containerd => ("CUINTERPOSE_TEST_CTR", "ctr"),
        };
        let address = PathBuf::from(setting("CUINTERPOSE_TEST_CONTAINERD", String::new));
        let program = std::env::var_os(var)
            .map(PathBuf::from)
            .or_else(|| on_path(name));
        let image = setting("CUINTERPOSE_TEST_PODMAN_IMAGE", || {
            "localhost/cuinterpose-test-base:1".into()
        });
        let missing = match &program {
            None => Some(format!("{name} is not installed")),
            Some(_) if kind == Kind::Runc && !rootfs.join("bin/busybox").is_file() => {
                Some(format!("no image root directory at {}", rootfs.display()))
            }
            Some(p) if kind == Kind::Podman && !podman_has_image(p, &image) => {
                Some(format!("Podman has no image {image}"))
            }
            Some(_) if kind == Kind::Containerd && !address.exists() => Some(format!(
                "no containerd answers (CUINTERPOSE_TEST_CONTAINERD: {:?})",
                address
            )),
            Some(_) => None,
        };
        if let Some(why) = missing {
            let hint = "run scripts/container-runtimes.sh install (as root)";
            let required = std::env::var("CI").is_ok_and(|v| v == "true")
                || std::env::var("CUINTERPOSE_TEST_RUNTIMES").is_ok_and(|v| v == "required");
            if required {
                panic!("{why}: CI must run the real-runtime tests; {hint}");
            }
            eprintln!("skipped: {why} ({hint})");
            return None;
        }
        let podman_args = setting("CUINTERPOSE_TEST_PODMAN_ARGS", || {
            "--runtime runc --network none --ulimit nofile=20000:20000 \
             --ulimit nproc=32768:32768"
                .into()
        })
        .split_whitespace()
        .map(String::from)
        .collect();
        Some(Runtime {
            kind,
            program: program.expect("checked above"),
            rootfs,
            image,
            address,
            podman_args,
            privileged: false,
        })
    }

    /// This runtime making privileged containers, which can make PID namespaces of their own
    /// (`cuinterpose run --pid-namespace` inside): Podman's `--privileged` (every capability, no
    /// seccomp filter, no masked or read-only `/proc` paths); runc's default bundle with every
    /// capability of the bounding set, no masked or read-only paths and no rlimits of its own,
    /// as `--privileged` makes it.
    pub fn privileged(mut self) -> Runtime {
        self.privileged = true;
        self
    }

    /// Which runtime.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The program and arguments that run a command (appended after them) as the init of a new
    /// container named `name`, in the foreground (the runtime's client waits for it), with `binds`
    /// bound at their own paths and the caller's whole environment. runc's bundle is made in
    /// `scratch` (outside every bound directory: a bundle under one would show its mounts in the
    /// container's table). The container's stdio: runc passes the client's own; Podman's are
    /// pipes to its monitor (conmon), which the client copies.
    pub fn wrapper(&self, name: &str, binds: &[&Path], scratch: &Path) -> Vec<String> {
        let path = |p: &Path| p.to_str().expect("a UTF-8 path").to_string();
        match self.kind {
            Kind::Runc => {
                let mut words: Vec<String> = ["bash", "-c", RUNC_SCRIPT, "runc-container"]
                    .map(String::from)
                    .to_vec();
                words.push(path(&self.program));
                words.push(
                    if self.privileged {
                        "privileged"
                    } else {
                        "default"
                    }
                    .into(),
                );
                words.push(path(&scratch.join(name)));
                words.push(name.into());
                words.push(path(&self.rootfs));
                words.extend(binds.iter().map(|b| path(b)));
                words.push("--".into());
                words
            }
            Kind::Containerd => {
                let mut words: Vec<String> = ["bash", "-c", CTR_SCRIPT, "ctr-container"]
                    .map(String::from)
                    .to_vec();
                words.push(path(&self.program));
                words.push(path(&self.address));
                words.push(
                    if self.privileged {
                        "privileged"
                    } else {
                        "default"
                    }
                    .into(),
                );
                words.push(name.into());
                words.push(self.image.clone());
                words.extend(binds.iter().map(|b| path(b)));
                words.push("--".into());
                words
            }
            Kind::Podman => {
                let mut words = vec![path(&self.program), "run".into(), "--name".into()];
                words.push(name.into());
                words.extend(self.podman_args.iter().cloned());
                if self.privileged {
                    words.push("--privileged".into());
                }
                words.extend(["--env-host".into(), "-v".into(), "/usr:/usr:ro".into()]);
                for b in binds {
                    words.push("-v".into());
                    words.push(format!("{0}:{0}", path(b)));
                }
                words.push(self.image.clone());
                words
            }
        }
    }

    /// The host PID of the init of container `name` once it runs `program` (its command line
    /// starts so), waiting up to `timeout`; panics naming the runtime's own error otherwise.
    pub fn wait_for_init(&self, name: &str, program: &str, timeout: Duration) -> u32 {
        let deadline = Instant::now() + timeout;
        let mut wanted = program.as_bytes().to_vec();
        wanted.push(0);
        loop {
            if let Some(pid) = self.init_pid(name).filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(&wanted))
            }) {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "container {name} did not start {program}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The host PID of the init of container `name`, as the runtime reports it.
    pub fn init_pid(&self, name: &str) -> Option<u32> {
        if self.kind == Kind::Containerd {
            let out = self.ctr().args(["task", "ls"]).output().ok()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let pid = text.lines().find_map(|l| {
                let mut words = l.split_whitespace();
                (words.next() == Some(name)).then(|| words.next()?.parse().ok())?
            });
            return pid.filter(|&p: &u32| p > 0);
        }
        let out = match self.kind {
            Kind::Runc => Command::new(&self.program).args(["state", name]).output(),
            Kind::Podman => Command::new(&self.program)
                .args(["inspect", "--format", "{{.State.Pid}}", name])
                .output(),
            Kind::Containerd => return None,
        }
        .ok()
        .filter(|o| o.status.success())?;
        let pid = match self.kind {
            Kind::Runc => serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()?
                .get("pid")?
                .as_u64()?,
            Kind::Podman | Kind::Containerd => {
                String::from_utf8_lossy(&out.stdout).trim().parse().ok()?
            }
        };
        u32::try_from(pid).ok().filter(|&p| p > 0)
    }

    /// How `cuinterpose checkpoint --container` and `restore --container` name container `name`
    /// of this runtime (`podman:NAME`, `containerd:ID`), with the variables the runtime's client
    /// needs in the tool's environment (containerd's socket and namespace, as `ctr` reads them);
    /// `None` for runc, which the tool does not ask.
    pub fn container_ref(&self, name: &str) -> Option<(String, Vec<(&'static str, String)>)> {
        match self.kind {
            Kind::Runc => None,
            Kind::Podman => Some((format!("podman:{name}"), Vec::new())),
            Kind::Containerd => Some((
                format!("containerd:{name}"),
                vec![
                    ("CONTAINERD_ADDRESS", self.address.display().to_string()),
                    ("CONTAINERD_NAMESPACE", "default".into()),
                ],
            )),
        }
    }

    /// `ctr` with containerd's socket.
    fn ctr(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.arg("--address").arg(&self.address);
        command.stdout(Stdio::piped()).stderr(Stdio::null());
        command
    }

    /// Removes container `name`, killing what still runs in it (nothing if there is none).
    pub fn remove(&self, name: &str) {
        if self.kind == Kind::Containerd {
            let quiet = |args: &[&str]| {
                let _ = self.ctr().args(args).stdout(Stdio::null()).status();
            };
            quiet(&["task", "kill", "--all", "--signal", "KILL", name]);
            quiet(&["task", "delete", "--force", name]);
            quiet(&["containers", "delete", name]);
            return;
        }
        let args: &[&str] = match self.kind {
            Kind::Runc => &["delete", "--force"],
            Kind::Podman => &["rm", "--force", "--time", "0"],
            Kind::Containerd => return,
        };
        let _ = Command::new(&self.program)
            .args(args)
            .arg(name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn podman_has_image(podman: &Path, image: &str) -> bool {
    Command::new(podman)
        .args(["image", "exists", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A container of a test, removed when dropped (whatever still runs in it is killed).
#[derive(Debug)]
pub struct Removed {
    runtime: Runtime,
    name: String,
}

impl Removed {
    /// Removes container `name` of `runtime` when dropped.
    pub fn new(runtime: &Runtime, name: &str) -> Removed {
        Removed {
            runtime: runtime.clone(),
            name: name.into(),
        }
    }
}

impl Drop for Removed {
    fn drop(&mut self) {
        self.runtime.remove(&self.name);
    }
}

/// runc's container, run by bash: `$1` runc, `$2` `privileged` ([`Runtime::privileged`]) or
/// `default`, `$3` the bundle directory (made here), `$4` the container's name, `$5` the image's
/// root directory (copied into the bundle: each container
/// writes its own), then the directories to bind up to `--`, then the command. The bundle's
/// `config.json` is runc's default (`runc spec`: new mount, PID, network, IPC and UTS namespaces,
/// masked and read-only `/proc` paths, `/dev` a tmpfs with its own `/dev/shm` and `/dev/mqueue`,
/// cgroups made by runc in every hierarchy), with the command, the caller's environment, a
/// writable root, no terminal (runc passes its own stdio to the container), the host's `/usr`
/// read-only and the binds. jq builds the lists one argument at a time (jq 1.6 reads `-c` after
/// `--args` as its own option).
pub const RUNC_SCRIPT: &str = r#"set -e
runc=$1; privileged=$2; bundle=$3; id=$4; rootfs=$5; shift 5
binds=()
while [ "$1" != -- ]; do binds+=("$1"); shift; done
shift
json_list() {
    local l='[]' a
    for a in "$@"; do l=$(jq -cn --argjson l "$l" --arg a "$a" '$l + [$a]'); done
    echo "$l"
}
# The capabilities of this process's bounding set, by name (a privileged container gets them all;
# runc cannot give one the bounding set lacks).
bounding_caps() {
    local names=(CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP
        LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER
        SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE
        SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP
        MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF
        CHECKPOINT_RESTORE)
    local bnd i
    bnd=$((16#$(awk '/^CapBnd:/{print $2}' /proc/self/status)))
    for i in "${!names[@]}"; do
        if (( (bnd >> i) & 1 )); then echo "CAP_${names[$i]}"; fi
    done
}
mkdir -p "$bundle/rootfs"
cp -a "$rootfs/." "$bundle/rootfs/"
cd "$bundle"
"$runc" spec
jq --argjson binds "$(json_list "${binds[@]}")" --argjson args "$(json_list "$@")" '
  .process.args = $args
  | .process.terminal = false
  | .process.env = ($ENV | to_entries | map("\(.key)=\(.value)"))
  | .root = {path: "rootfs", readonly: false}
  | .mounts += [{destination: "/usr", type: "bind", source: "/usr", options: ["rbind", "ro"]}]
  | .mounts += ($binds | map({destination: ., type: "bind", source: ., options: ["rbind", "rw"]}))
  | if $privileged == "privileged"
    then .process.capabilities |= with_entries(.value = $caps)
      | del(.linux.maskedPaths, .linux.readonlyPaths) | del(.process.rlimits)
    else . end
' --arg privileged "$privileged" --argjson caps "$(json_list $(bounding_caps))" \
    config.json >config.json.new
mv config.json.new config.json
exec "$runc" run --bundle "$bundle" "$id"
"#;

/// containerd's container, run by bash: `$1` ctr, `$2` containerd's socket, `$3` `privileged` or
/// `default`, `$4` the container's name, `$5` the image, then the directories to bind up to `--`,
/// then the command. `ctr run --rm` in the foreground (its shim gives the container pipes as
/// stdio, which ctr copies), the host's `/usr` read-only, the binds, and the caller's whole
/// environment (`--env` one variable at a time).
pub const CTR_SCRIPT: &str = r#"set -e
ctr=$1; address=$2; privileged=$3; id=$4; image=$5; shift 5
opts=(--mount type=bind,src=/usr,dst=/usr,options=rbind:ro)
while [ "$1" != -- ]; do opts+=(--mount "type=bind,src=$1,dst=$1,options=rbind:rw"); shift; done
shift
[ "$privileged" = privileged ] && opts+=(--privileged)
while IFS= read -r -d '' kv; do opts+=(--env "$kv"); done < <(env -0)
exec "$ctr" --address "$address" run --rm "${opts[@]}" "$image" "$id" "$@"
"#;
