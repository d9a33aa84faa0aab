//! `cuinterpose doctor`: whether this machine has what the product needs, one check each, with
//! what to fix. Read-only: it loads the driver (as every command does), asks CRIU to `check`, and
//! reads `/proc`, `/sys` and the limits; it changes nothing.
//!
//! A check is `ok`; `warn` (works, with the limitation it names); `fail` (a command of the product
//! will not work here as it is); or `skip` (not checked because what it needs failed above).

mod probe;

use crate::criu::Criu;
use crate::layout::Layout;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use probe::DriverProbe;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    Skip,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One check: what it found and, unless it is ok, what to do about it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// One GPU as the driver reports it.
#[derive(Debug, Clone, Serialize)]
pub struct Gpu {
    pub ordinal: u32,
    pub name: String,
    pub uuid: Option<String>,
    pub memory_total: Option<u64>,
    pub memory_free: Option<u64>,
}

/// Everything doctor found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// No check failed.
    pub ok: bool,
    pub checks: Vec<Check>,
    pub gpus: Vec<Gpu>,
}

/// What to check against.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The driver library (default: `libcuda.so.1` from the loader's path).
    pub driver: Option<PathBuf>,
    /// The CRIU binary given by `--criu` (default: as `checkpoint` finds it).
    pub criu: Option<PathBuf>,
    /// `CUINTERPOSE_CRIU` ([`crate::config::ToolConfig::criu`]), tried before the bundled one.
    pub configured_criu: Option<PathBuf>,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
        fix: None,
    }
}

fn fix(mut check: Check, fix: impl Into<String>) -> Check {
    check.fix = Some(fix.into());
    check
}

/// Runs every check.
pub fn diagnose(options: &Options) -> Report {
    let mut checks = Vec::new();
    let mut gpus = Vec::new();
    driver_checks(options.driver.as_deref(), &mut checks, &mut gpus);
    checks.push(shim_check());
    let privileged = Privileges::read();
    criu_checks(
        options.criu.as_deref(),
        options.configured_criu.as_deref(),
        privileged.root,
        &mut checks,
    );
    checks.push(checkpoint_restore_check());
    checks.push(pidfd_check());
    checks.push(ptrace_check(&privileged));
    checks.push(privileges_check(&privileged));
    checks.push(control_dir_check());
    checks.push(shm_check());
    checks.push(hugepage_check());
    checks.push(memlock_check());
    checks.push(host_memory_check(&gpus, &checks));
    Report {
        ok: checks.iter().all(|c| c.status != Status::Fail),
        checks,
        gpus,
    }
}

fn driver_checks(driver: Option<&Path>, checks: &mut Vec<Check>, gpus: &mut Vec<Gpu>) {
    let probe = match DriverProbe::load(driver) {
        Ok(probe) => probe,
        Err(message) => {
            checks.push(fix(
                check("driver", Status::Fail, message.to_string()),
                "install the NVIDIA driver (libcuda.so.1 on the loader's path), or pass --driver PATH",
            ));
            for name in ["checkpoint-api", "gpus"] {
                checks.push(check(name, Status::Skip, "no driver"));
            }
            return;
        }
    };
    let version = probe.version();
    checks.push(check(
        "driver",
        Status::Ok,
        format!(
            "{} (CUDA driver API {}.{})",
            probe.path().display(),
            version / 1000,
            version % 1000 / 10
        ),
    ));
    let missing = probe.missing_checkpoint_api();
    checks.push(if missing.is_empty() {
        check(
            "checkpoint-api",
            Status::Ok,
            format!("{} present", probe::CHECKPOINT_API.join(", ")),
        )
    } else {
        fix(
            check(
                "checkpoint-api",
                Status::Fail,
                format!("the driver lacks {}", missing.join(", ")),
            ),
            "update the NVIDIA driver to one with the CUDA checkpoint API (cuinterpose is tested on r580)",
        )
    });
    match probe.gpus() {
        Ok(found) if !found.is_empty() => {
            let names = found
                .iter()
                .map(|g| match &g.uuid {
                    Some(uuid) => format!("{}: {} ({uuid})", g.ordinal, g.name),
                    None => format!("{}: {}", g.ordinal, g.name),
                })
                .collect::<Vec<_>>()
                .join("; ");
            checks.push(check(
                "gpus",
                Status::Ok,
                format!("{} GPU(s): {names}", found.len()),
            ));
            *gpus = found;
        }
        Ok(_) => checks.push(fix(
            check("gpus", Status::Fail, "the driver sees no GPU"),
            "check nvidia-smi, and CUDA_VISIBLE_DEVICES / the container's GPU access",
        )),
        Err(message) => checks.push(fix(
            check("gpus", Status::Fail, message.to_string()),
            "check nvidia-smi and the driver's installation",
        )),
    }
}

fn shim_check() -> Check {
    let candidates = Layout::current()
        .map(|l| l.shim_candidates())
        .unwrap_or_default();
    match candidates.iter().find(|c| c.is_file()) {
        Some(found) => check("shim", Status::Ok, found.display().to_string()),
        None => fix(
            check(
                "shim",
                Status::Fail,
                format!(
                    "{} not found next to the tool (looked at {})",
                    crate::discovery::SHIM_LIBRARY,
                    joined(&candidates)
                ),
            ),
            "reinstall the release (lib/libcuinterpose.so beside bin/), or build the workspace",
        ),
    }
}

fn joined(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The oldest CRIU the checkpoint to disk works with (TCP sockets on kernels from 6.16 on).
const CRIU_MINIMUM: (u32, u32) = (4, 2);

fn criu_checks(
    explicit: Option<&Path>,
    configured: Option<&Path>,
    root: bool,
    checks: &mut Vec<Check>,
) {
    let criu = match Criu::locate(explicit, configured) {
        Ok(criu) => criu,
        Err(error) => {
            checks.push(fix(
                check("criu", Status::Fail, error.to_string()),
                "reinstall the release (libexec/cuinterpose/criu), or pass --criu PATH",
            ));
            checks.push(check("criu-check", Status::Skip, "no CRIU"));
            return;
        }
    };
    let mut numbers = criu.version().split('.').map(|n| n.parse::<u32>().ok());
    let version = (
        numbers.next().flatten().unwrap_or(0),
        numbers.next().flatten().unwrap_or(0),
    );
    let detail = format!("{} {}", criu.program().display(), criu.version());
    checks.push(if version >= CRIU_MINIMUM {
        check("criu", Status::Ok, detail)
    } else {
        fix(
            check(
                "criu",
                Status::Fail,
                format!("{detail}: older than {}.{}", CRIU_MINIMUM.0, CRIU_MINIMUM.1),
            ),
            "use the bundled CRIU (libexec/cuinterpose/criu) or CRIU 4.2 or newer",
        )
    });
    if !root {
        checks.push(fix(
            check(
                "criu-check",
                Status::Warn,
                "not run: `criu check` needs root",
            ),
            "run doctor as root to check the kernel for CRIU",
        ));
        return;
    }
    checks.push(match Command::new(criu.program()).arg("check").output() {
        Ok(out) if out.status.success() => {
            let said = String::from_utf8_lossy(&out.stdout);
            check(
                "criu-check",
                Status::Ok,
                said.lines().last().unwrap_or("passed").trim().to_string(),
            )
        }
        Ok(out) => {
            let said = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let last: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
            fix(
                check(
                    "criu-check",
                    Status::Fail,
                    format!(
                        "criu check failed ({}): {}",
                        out.status,
                        last[last.len().saturating_sub(3)..].join(" | ")
                    ),
                ),
                "the kernel lacks what CRIU needs; `criu check --all` names it",
            )
        }
        Err(error) => check(
            "criu-check",
            Status::Fail,
            format!("running {}: {error}", criu.program().display()),
        ),
    });
}

fn checkpoint_restore_check() -> Check {
    // ns_last_pid exists only in kernels built with CONFIG_CHECKPOINT_RESTORE, which CRIU needs.
    if Path::new("/proc/sys/kernel/ns_last_pid").exists() {
        check(
            "kernel-checkpoint-restore",
            Status::Ok,
            "CONFIG_CHECKPOINT_RESTORE (/proc/sys/kernel/ns_last_pid present)",
        )
    } else {
        fix(
            check(
                "kernel-checkpoint-restore",
                Status::Fail,
                "no /proc/sys/kernel/ns_last_pid: the kernel was built without CONFIG_CHECKPOINT_RESTORE",
            ),
            "checkpoint to disk needs a kernel with CONFIG_CHECKPOINT_RESTORE (suspend/resume does not)",
        )
    }
}

fn pidfd_check() -> Check {
    // `run --pid-namespace` waits on and signals the namespace's init through a pidfd.
    match rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    ) {
        Ok(_) => check("pidfd", Status::Ok, "pidfd_open works"),
        Err(errno) => fix(
            check("pidfd", Status::Fail, format!("pidfd_open: {errno}")),
            "`run --pid-namespace` needs pidfd_open (Linux 5.3 or newer, not blocked by seccomp)",
        ),
    }
}

/// The process's identity and effective capabilities.
#[derive(Debug)]
struct Privileges {
    root: bool,
    /// `CapEff` of /proc/self/status.
    effective: u64,
}

const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_CHECKPOINT_RESTORE: u32 = 40;

impl Privileges {
    fn read() -> Privileges {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let effective = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            .unwrap_or(0);
        Privileges {
            root: rustix::process::geteuid().is_root(),
            effective,
        }
    }

    fn has(&self, capability: u32) -> bool {
        self.effective & (1 << capability) != 0
    }
}

fn ptrace_check(privileges: &Privileges) -> Check {
    let path = "/proc/sys/kernel/yama/ptrace_scope";
    let Ok(text) = std::fs::read_to_string(path) else {
        return check(
            "ptrace-scope",
            Status::Ok,
            "no Yama LSM: ptrace unrestricted",
        );
    };
    let scope = text.trim();
    match scope {
        "0" | "1" => check("ptrace-scope", Status::Ok, format!("{path} = {scope}")),
        "2" if privileges.has(CAP_SYS_PTRACE) => check(
            "ptrace-scope",
            Status::Ok,
            format!("{path} = 2 (admin only; this process has CAP_SYS_PTRACE)"),
        ),
        "2" => fix(
            check(
                "ptrace-scope",
                Status::Fail,
                format!("{path} = 2: only CAP_SYS_PTRACE may ptrace, and this process lacks it"),
            ),
            "run as root (CRIU dumps through ptrace)",
        ),
        other => fix(
            check(
                "ptrace-scope",
                Status::Fail,
                format!("{path} = {other}: ptrace disabled, CRIU cannot dump"),
            ),
            "set kernel.yama.ptrace_scope to 1 (a value of 3 holds until reboot)",
        ),
    }
}

fn privileges_check(privileges: &Privileges) -> Check {
    if privileges.root {
        return check(
            "privileges",
            Status::Ok,
            format!("root (CapEff {:016x})", privileges.effective),
        );
    }
    let named = [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
    ];
    let held: Vec<&str> = named
        .iter()
        .filter(|(c, _)| privileges.has(*c))
        .map(|(_, n)| *n)
        .collect();
    let enough = privileges.has(CAP_SYS_PTRACE)
        && (privileges.has(CAP_SYS_ADMIN) || privileges.has(CAP_CHECKPOINT_RESTORE));
    let detail = format!(
        "not root; holds {}",
        if held.is_empty() {
            "none of CAP_SYS_ADMIN, CAP_CHECKPOINT_RESTORE, CAP_SYS_PTRACE".to_string()
        } else {
            held.join(", ")
        }
    );
    if enough {
        check("privileges", Status::Ok, detail)
    } else {
        fix(
            check("privileges", Status::Warn, detail),
            "suspend/resume reach only this user's processes; checkpoint to disk and `run --pid-namespace` need root (or CAP_CHECKPOINT_RESTORE with CAP_SYS_PTRACE)",
        )
    }
}

/// `sun_path` holds 108 bytes with its NUL; the shim binds
/// `<dir>/cuinterpose-<pid namespace inode>-<pid>.sock`.
const SOCKET_PATH_MAX: usize = 107;
const SOCKET_NAME_MAX: usize = "/cuinterpose-4294967295-4194304.sock".len();

/// The directory the workloads' shims bind their sockets in: `CUINTERPOSE_CONTROL_DIR` as the
/// shim reads it (a setting of the workloads, read here only to check it), else the shim's private
/// default, which the first workload creates when it does not exist yet (its parent is checked).
fn control_dir_check() -> Check {
    let dir = std::env::var_os("CUINTERPOSE_CONTROL_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(transport::files::default_private_dir);
    if !dir.exists()
        && let Some(parent) = dir.parent().filter(|p| p.is_dir())
        && rustix::fs::access(parent, rustix::fs::Access::WRITE_OK).is_ok()
        && dir.display().to_string().len() + SOCKET_NAME_MAX <= SOCKET_PATH_MAX
    {
        return check(
            "control-dir",
            Status::Ok,
            format!("{} (made private by the first workload)", dir.display()),
        );
    }
    let shown = dir.display().to_string();
    let to_fix = "create it, or set CUINTERPOSE_CONTROL_DIR (for the workloads and the tool) to a short, writable directory";
    if !dir.is_dir() {
        return fix(
            check(
                "control-dir",
                Status::Fail,
                format!("{shown} is not a directory"),
            ),
            to_fix,
        );
    }
    if rustix::fs::access(
        &dir,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .is_err()
    {
        return fix(
            check(
                "control-dir",
                Status::Fail,
                format!("{shown} is not writable here"),
            ),
            to_fix,
        );
    }
    if shown.len() + SOCKET_NAME_MAX > SOCKET_PATH_MAX {
        return fix(
            check(
                "control-dir",
                Status::Fail,
                format!("{shown} is too long for a socket path ({SOCKET_PATH_MAX} bytes)"),
            ),
            to_fix,
        );
    }
    check("control-dir", Status::Ok, format!("{shown} (writable)"))
}

/// Below this, NCCL and PyTorch's shared buffers run out (Docker's default is 64 MiB).
const SHM_MINIMUM: u64 = 1 << 30;
const TMPFS_MAGIC: u32 = 0x0102_1994;

fn shm_check() -> Check {
    let path = "/dev/shm";
    let Ok(stat) = rustix::fs::statfs(path) else {
        return fix(
            check("dev-shm", Status::Fail, format!("{path} is missing")),
            "mount a tmpfs on /dev/shm",
        );
    };
    let size = stat.f_blocks * stat.f_bsize as u64;
    let free = stat.f_bavail * stat.f_bsize as u64;
    let detail = format!("{path}: {} free of {}", gib(free), gib(size));
    if stat.f_type as u32 != TMPFS_MAGIC {
        return fix(
            check("dev-shm", Status::Warn, format!("{detail}, not a tmpfs")),
            "mount a tmpfs on /dev/shm",
        );
    }
    if rustix::fs::access(path, rustix::fs::Access::WRITE_OK).is_err() {
        return fix(
            check("dev-shm", Status::Fail, format!("{detail}, not writable")),
            "make /dev/shm writable (mode 1777)",
        );
    }
    if size < SHM_MINIMUM {
        return fix(
            check("dev-shm", Status::Warn, format!("{detail}: under 1 GiB")),
            "NCCL and PyTorch keep shared buffers there: give it more (docker run --shm-size=8g)",
        );
    }
    check("dev-shm", Status::Ok, detail)
}

fn hugepage_check() -> Check {
    let path = "/sys/kernel/mm/transparent_hugepage/enabled";
    let Ok(text) = std::fs::read_to_string(path) else {
        return fix(
            check(
                "transparent-hugepages",
                Status::Warn,
                "the kernel has no transparent huge pages",
            ),
            "host carriers get 4 KiB pages only",
        );
    };
    let mode = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[').and_then(|w| w.strip_suffix(']')))
        .unwrap_or("unknown")
        .to_string();
    // The shims ask for huge pages on their host carriers (MADV_HUGEPAGE), so `madvise` is as
    // good as `always` for them.
    if mode == "always" || mode == "madvise" {
        check(
            "transparent-hugepages",
            Status::Ok,
            format!("{path}: {mode} (the host carriers are madvised)"),
        )
    } else {
        fix(
            check(
                "transparent-hugepages",
                Status::Warn,
                format!("{path}: {mode}"),
            ),
            "the host carriers get 2 MiB pages (faster pinning and copies) only with `madvise` or `always`",
        )
    }
}

fn memlock_check() -> Check {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock);
    let show = |v: Option<u64>| v.map_or("unlimited".to_string(), gib);
    let detail = format!(
        "RLIMIT_MEMLOCK soft {}, hard {}",
        show(limit.current),
        show(limit.maximum)
    );
    if limit.current.is_none() {
        check("memlock", Status::Ok, detail)
    } else {
        fix(
            check("memlock", Status::Warn, detail),
            "workloads started from here inherit it; NCCL's RDMA transports pin memory under it: ulimit -l unlimited (docker run --ulimit memlock=-1)",
        )
    }
}

fn host_memory_check(gpus: &[Gpu], checks: &[Check]) -> Check {
    let available = crate::procfs::meminfo("MemAvailable:");
    let used: Option<u64> = gpus
        .iter()
        .map(|g| Some(g.memory_total? - g.memory_free?))
        .sum();
    let Some(available) = available else {
        return check(
            "host-memory",
            Status::Fail,
            "/proc/meminfo has no MemAvailable",
        );
    };
    let gpu_checked = checks
        .iter()
        .any(|c| c.name == "gpus" && c.status == Status::Ok);
    let Some(used) = used.filter(|_| gpu_checked) else {
        return check(
            "host-memory",
            Status::Skip,
            format!("{} available; no GPU memory to compare", gib(available)),
        );
    };
    let detail = format!(
        "{} available for the {} of GPU memory in use that a suspend would move to host memory",
        gib(available),
        gib(used)
    );
    if used <= available {
        check("host-memory", Status::Ok, detail)
    } else {
        fix(
            check("host-memory", Status::Fail, detail),
            "free host memory (or add swap) before suspending everything on these GPUs",
        )
    }
}

fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}
