//! The tool's configuration: every environment variable it reads, read once at start into one
//! [`ToolConfig`] that the commands are given (the tool never reads a workload's environment; see
//! `discovery`).
//!
//! [`ToolConfig::SETTINGS`] lists the variables with their defaults as the settings table of
//! docs/settings.md states them; the parser reads each variable through that list, and tests hold
//! the list, the table and the parsed defaults to each other. A value that does not parse is an
//! error ([`ConfigError`]; the CLI exits 2, as for a bad argument) rather than a silent default. An
//! empty value counts as unset. `PATH` (where CRIU is looked for) and `LD_PRELOAD` (which `run`
//! extends) are the system's, not settings.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// An environment variable, with its default as the settings table of docs/settings.md states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    /// The default in the table's words (its first word or words, before any parenthesis).
    pub default: &'static str,
}

const LOG: Setting = Setting {
    name: "CUINTERPOSE_LOG",
    default: "warn",
};
const SHIM: Setting = Setting {
    name: "CUINTERPOSE_SHIM",
    default: "libcuinterpose.so next to the tool, or in ../lib",
};
const CRIU: Setting = Setting {
    name: "CUINTERPOSE_CRIU",
    default: "the bundled one",
};
const LOCK_DIR: Setting = Setting {
    name: "CUINTERPOSE_LOCK_DIR",
    default: "locks/ in the same private directory",
};
const SIGNING_KEY: Setting = Setting {
    name: "CUINTERPOSE_SIGNING_KEY",
    default: "/var/lib/cuinterpose/checkpoint.key",
};
/// Internal: lets tests of a participant that does not answer run in seconds instead of tens of
/// seconds.
const ANSWER_TIMEOUT_MS: Setting = Setting {
    name: "CUINTERPOSE_ANSWER_TIMEOUT_MS",
    default: "10000",
};

/// The GPU memory a carrier helper's context needs on each device beside what the group holds,
/// in MiB: `--carrier auto` chooses the helper only where every device has it free. 560: the 527
/// MiB its context took on the H200 (the placement experiment) plus 32 MiB of registrations for
/// 8-16 GiB of carrier.
const HELPER_CONTEXT_MIB: Setting = Setting {
    name: "CUINTERPOSE_HELPER_CONTEXT_MIB",
    default: "560",
};

/// The most host memory, in MiB, `cuinterpose prepare` pins ahead of the first suspend;
/// `unlimited`: as much as the group's carriers need, within what `--carrier auto` checks
/// (RLIMIT_MEMLOCK, half the host's available memory).
const PIN_AHEAD_MIB: Setting = Setting {
    name: "CUINTERPOSE_PIN_AHEAD_MIB",
    default: "unlimited",
};

/// How long the tool waits for a shim to accept and answer a read-only request, unless
/// `CUINTERPOSE_ANSWER_TIMEOUT_MS` says otherwise.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the tool takes from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolConfig {
    /// The log filter (`tracing` directives), for the CLI's subscriber.
    pub log: String,
    /// The shim `cuinterpose run` preloads when `--shim` is not given; `None`: the one next to the
    /// tool or in the release's `lib/` (crate::layout).
    pub shim: Option<PathBuf>,
    /// The CRIU binary when `--criu` is not given; `None` (or a path that is not a file): the
    /// bundled one (crate::layout), then `criu` on `PATH`.
    pub criu: Option<PathBuf>,
    /// How long a shim may take to accept and answer a read-only request.
    pub answer_timeout: Duration,
    /// Where the run locks go; `None`: `locks/` in the user's private directory.
    pub lock_dir: Option<PathBuf>,
    /// The key file checkpoints are signed and verified with (disk/signing.rs).
    pub signing_key: PathBuf,
    /// Free GPU memory each device needs for `--carrier auto` to choose the carrier helper
    /// (carrier_policy.rs).
    pub helper_context_bytes: u64,
    /// The most host memory `cuinterpose prepare` pins ahead (`None`: no budget of its own).
    pub pin_ahead_budget: Option<u64>,
}

/// A variable whose value the tool does not understand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not {expected}")]
pub struct ConfigError {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
}

impl Default for ToolConfig {
    /// The configuration of an empty environment.
    fn default() -> ToolConfig {
        ToolConfig {
            log: LOG.default.to_string(),
            shim: None,
            criu: None,
            answer_timeout: ANSWER_TIMEOUT,
            lock_dir: None,
            signing_key: PathBuf::from(SIGNING_KEY.default),
            helper_context_bytes: 560 << 20,
            pin_ahead_budget: None,
        }
    }
}

impl ToolConfig {
    /// Every variable the tool reads.
    pub const SETTINGS: &'static [Setting] = &[
        LOG,
        SHIM,
        CRIU,
        LOCK_DIR,
        SIGNING_KEY,
        ANSWER_TIMEOUT_MS,
        HELPER_CONTEXT_MIB,
        PIN_AHEAD_MIB,
    ];

    /// The configuration of this process's environment.
    pub fn from_env() -> Result<ToolConfig, ConfigError> {
        ToolConfig::from_lookup(|name| std::env::var_os(name))
    }

    /// The configuration `lookup` gives (a variable's value, `None` when unset); the first value
    /// that is not understood is an error.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<OsString>,
    ) -> Result<ToolConfig, ConfigError> {
        let value = |setting: &Setting| lookup(setting.name).filter(|v| !v.is_empty());
        let text = |setting: &Setting, expected: &'static str| {
            value(setting)
                .map(|v| {
                    v.into_string().map_err(|v| ConfigError {
                        name: setting.name,
                        value: v.to_string_lossy().into_owned(),
                        expected,
                    })
                })
                .transpose()
        };
        let defaults = ToolConfig::default();
        let log = text(&LOG, "UTF-8 text")?.unwrap_or(defaults.log);
        let answer_timeout = match text(&ANSWER_TIMEOUT_MS, ANSWER_TIMEOUT_EXPECTED)? {
            None => defaults.answer_timeout,
            Some(ms) => ms
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|&ms| ms > 0)
                .map(Duration::from_millis)
                .ok_or(ConfigError {
                    name: ANSWER_TIMEOUT_MS.name,
                    value: ms,
                    expected: ANSWER_TIMEOUT_EXPECTED,
                })?,
        };
        let helper_context_bytes = match text(&HELPER_CONTEXT_MIB, HELPER_CONTEXT_EXPECTED)? {
            None => defaults.helper_context_bytes,
            Some(mib) => mib
                .trim()
                .parse::<u64>()
                .ok()
                .and_then(|mib| mib.checked_mul(1 << 20))
                .ok_or(ConfigError {
                    name: HELPER_CONTEXT_MIB.name,
                    value: mib,
                    expected: HELPER_CONTEXT_EXPECTED,
                })?,
        };
        let pin_ahead_budget = match text(&PIN_AHEAD_MIB, PIN_AHEAD_EXPECTED)? {
            None => defaults.pin_ahead_budget,
            Some(v) if v.trim() == PIN_AHEAD_MIB.default => None,
            Some(mib) => Some(
                mib.trim()
                    .parse::<u64>()
                    .ok()
                    .and_then(|mib| mib.checked_mul(1 << 20))
                    .ok_or(ConfigError {
                        name: PIN_AHEAD_MIB.name,
                        value: mib,
                        expected: PIN_AHEAD_EXPECTED,
                    })?,
            ),
        };
        Ok(ToolConfig {
            log,
            helper_context_bytes,
            pin_ahead_budget,
            shim: value(&SHIM).map(PathBuf::from),
            criu: value(&CRIU).map(PathBuf::from),
            answer_timeout,
            lock_dir: value(&LOCK_DIR)
                .map(PathBuf::from)
                .map(|dir| {
                    usable_lock_dir(&dir)
                        .then_some(dir.clone())
                        .ok_or_else(|| ConfigError {
                            name: LOCK_DIR.name,
                            value: dir.to_string_lossy().into_owned(),
                            expected: LOCK_DIR_EXPECTED,
                        })
                })
                .transpose()?,
            signing_key: value(&SIGNING_KEY)
                .map(PathBuf::from)
                .unwrap_or(defaults.signing_key),
        })
    }
}

const LOCK_DIR_EXPECTED: &str = "a directory the tool can create its locks in (an absolute path \
     whose nearest existing part is a writable directory, not in /proc or /sys)";

/// Whether the tool can make `dir` (if need be) and its lock files in it: an absolute path whose
/// nearest existing part is a directory it may write, on a filesystem that holds files (a file,
/// `/proc/1` or anything in `/sys` would fail every command at its first lock instead).
fn usable_lock_dir(dir: &std::path::Path) -> bool {
    if !dir.is_absolute() {
        return false;
    }
    let Some(existing) = dir
        .ancestors()
        .find(|p| std::fs::symlink_metadata(p).is_ok())
    else {
        return false;
    };
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    let pseudo = rustix::fs::statfs(existing)
        .map(|s| [PROC_SUPER_MAGIC, SYSFS_MAGIC].contains(&s.f_type))
        .unwrap_or(true);
    existing.is_dir()
        && !pseudo
        && rustix::fs::access(existing, rustix::fs::Access::WRITE_OK).is_ok()
}

const HELPER_CONTEXT_EXPECTED: &str = "a number of MiB";

const PIN_AHEAD_EXPECTED: &str = "a number of MiB, or unlimited";

const ANSWER_TIMEOUT_EXPECTED: &str = "a positive number of milliseconds";

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    fn with(vars: &[(&str, &str)]) -> Result<ToolConfig, ConfigError> {
        let vars: BTreeMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        ToolConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn a_lock_directory_that_cannot_hold_locks_is_a_bad_setting() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let under_file = file.join("locks");
        for bad in [
            file.to_str().unwrap(),
            under_file.to_str().unwrap(),
            "/proc/1",
            "/sys/kernel",
            "relative/locks",
        ] {
            let err = with(&[("CUINTERPOSE_LOCK_DIR", bad)]).unwrap_err();
            assert_eq!(err.name, "CUINTERPOSE_LOCK_DIR", "{bad}");
            assert!(err.to_string().contains("create its locks in"), "{err}");
        }
        let new = dir.path().join("new/locks");
        let good = with(&[("CUINTERPOSE_LOCK_DIR", new.to_str().unwrap())]).unwrap();
        assert_eq!(good.lock_dir, Some(new));
    }

    #[test]
    fn values_are_parsed_and_an_invalid_one_is_an_error_naming_it() {
        assert_eq!(with(&[]).unwrap(), ToolConfig::default());
        assert_eq!(
            with(&[
                ("CUINTERPOSE_LOG", "cuinterpose=debug"),
                ("CUINTERPOSE_SHIM", "/opt/lib/libcuinterpose.so"),
                ("CUINTERPOSE_CRIU", "/opt/criu/sbin/criu"),
                ("CUINTERPOSE_ANSWER_TIMEOUT_MS", " 1500 "),
                ("CUINTERPOSE_LOCK_DIR", "/run/locks"),
                ("CUINTERPOSE_SIGNING_KEY", "/etc/cuinterpose/cluster.key"),
                ("CUINTERPOSE_HELPER_CONTEXT_MIB", "300"),
                ("CUINTERPOSE_PIN_AHEAD_MIB", "1024"),
            ])
            .unwrap(),
            ToolConfig {
                log: "cuinterpose=debug".into(),
                shim: Some("/opt/lib/libcuinterpose.so".into()),
                criu: Some("/opt/criu/sbin/criu".into()),
                answer_timeout: Duration::from_millis(1500),
                lock_dir: Some("/run/locks".into()),
                signing_key: "/etc/cuinterpose/cluster.key".into(),
                helper_context_bytes: 300 << 20,
                pin_ahead_budget: Some(1 << 30),
            }
        );
        let e = with(&[("CUINTERPOSE_HELPER_CONTEXT_MIB", "lots")]).unwrap_err();
        assert_eq!(e.name, "CUINTERPOSE_HELPER_CONTEXT_MIB");
        // Empty counts as unset.
        assert_eq!(
            with(&[
                ("CUINTERPOSE_ANSWER_TIMEOUT_MS", ""),
                ("CUINTERPOSE_CRIU", "")
            ])
            .unwrap(),
            ToolConfig::default()
        );
        for bad in ["0", "-5", "ten", "1.5", "18446744073709551616"] {
            let e = with(&[("CUINTERPOSE_ANSWER_TIMEOUT_MS", bad)]).unwrap_err();
            assert_eq!(e.name, "CUINTERPOSE_ANSWER_TIMEOUT_MS", "{bad}");
            assert_eq!(
                e.to_string(),
                format!(
                    "CUINTERPOSE_ANSWER_TIMEOUT_MS={bad:?} is not a positive number of milliseconds"
                )
            );
        }
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'x', 0xff]);
        let e = ToolConfig::from_lookup(|name| (name == "CUINTERPOSE_LOG").then(|| odd.clone()))
            .unwrap_err();
        assert_eq!(e.name, "CUINTERPOSE_LOG");
        // Paths need not be UTF-8.
        let config =
            ToolConfig::from_lookup(|name| (name == "CUINTERPOSE_CRIU").then(|| odd.clone()))
                .unwrap();
        assert_eq!(config.criu, Some(PathBuf::from(odd)));
    }

    #[test]
    fn the_listed_defaults_are_the_defaults_and_only_listed_variables_are_read() {
        let asked = RefCell::new(Vec::new());
        let unset = ToolConfig::from_lookup(|name| {
            asked.borrow_mut().push(name.to_string());
            None
        })
        .unwrap();
        let mut asked = asked.into_inner();
        asked.sort();
        asked.dedup();
        let mut listed: Vec<String> = ToolConfig::SETTINGS
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        listed.sort();
        assert_eq!(asked, listed);
        // The defaults that are values: setting them changes nothing. The shim's, CRIU's and the
        // locks' are searches or rules ("next to the tool", "on PATH", "the private directory"),
        // which an unset variable leaves to the caller.
        for setting in [LOG, ANSWER_TIMEOUT_MS, HELPER_CONTEXT_MIB, PIN_AHEAD_MIB] {
            let explicit = ToolConfig::from_lookup(|name| {
                (name == setting.name).then(|| OsString::from(setting.default))
            })
            .unwrap();
            assert_eq!(explicit, unset, "{}", setting.name);
        }
        assert_eq!((unset.shim, unset.criu, unset.lock_dir), (None, None, None));
    }
}
