//! The shim's configuration: every environment variable it reads, each read once, when the runtime
//! starts (the first successful `cuInit`), into one [`ShimConfig`].
//!
//! [`ShimConfig::SETTINGS`] lists the variables with their defaults as the settings table of
//! docs/settings.md states them; the parser reads each variable through that list, and tests hold
//! the list, the table and the parsed defaults to each other. A value that does not parse is not
//! fatal (the shim must never break the application): the default is used and [`Invalid`] says so,
//! which the runtime logs as a warning. An empty value counts as unset.

use crate::log;
use copy::{CarrierMode, CarrierPolicy, CarrierRelease, CopyConfig, DEFAULT_CHUNK};
use std::ffi::OsString;
use std::path::PathBuf;

/// An environment variable, with its default as the settings table of docs/settings.md states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub name: &'static str,
    /// The default in the table's words (its first word or words, before any parenthesis).
    pub default: &'static str,
}

const CONTROL_DIR: Setting = Setting {
    name: "CUINTERPOSE_CONTROL_DIR",
    default: "private to the user",
};
const LOG: Setting = Setting {
    name: "CUINTERPOSE_LOG",
    default: "warn",
};
const CARRIER: Setting = Setting {
    name: "CUINTERPOSE_CARRIER",
    default: "auto",
};
const STAGING_CHUNK: Setting = Setting {
    name: "CUINTERPOSE_STAGING_CHUNK",
    default: "1M",
};
const CARRIER_RELEASE: Setting = Setting {
    name: "CUINTERPOSE_CARRIER_RELEASE",
    default: "never",
};

const ALLOC: Setting = Setting {
    name: "CUINTERPOSE_ALLOC",
    default: "vmm",
};

/// Staging buffer sizes accepted: a multiple of 4 KiB from 256 KiB to 64 MiB.
const CHUNK_RANGE: std::ops::RangeInclusive<usize> = (256 << 10)..=(64 << 20);
const CHUNK_ALIGN: usize = 4096;

/// Who makes `cuMemAlloc` memory (`CUINTERPOSE_ALLOC`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocMode {
    /// The shim, on VMM: saved through carriers at capture, legacy IPC served by the shim.
    #[default]
    Vmm,
    /// The driver: left to the native checkpoint, legacy IPC refused at capture.
    Native,
}

/// Where the runtime's sockets live, who it is and how it copies: what the runtime keeps of the
/// [`ShimConfig`] read at its start, and who this process is.
#[derive(Clone, Debug)]
pub struct Config {
    /// Directory of control sockets ([`ShimConfig::control_dir`], default the user's private
    /// directory: `transport::files::default_private_dir`).
    pub control_dir: PathBuf,
    /// This process's PID in its own namespace (`getpid()`): names its socket and its tickets.
    pub ns_pid: u32,
    /// How copies reach the host carrier ([`ShimConfig::copy`]).
    pub copy: CopyConfig,
    /// Inode of our PID namespace when the runtime started: in every socket name, so that
    /// processes of two PID namespaces sharing a directory never want the same name. Kept from
    /// the start (a restored process keeps it, with its socket, and its peers keep theirs).
    pub pid_namespace: u64,
    /// Who makes `cuMemAlloc` memory ([`ShimConfig::alloc`]).
    pub alloc: AllocMode,
}

impl Config {
    /// The control socket of the process with namespace PID `ns_pid` in our PID namespace (a
    /// ticket's creator is always there), in our control directory.
    pub fn socket_of(&self, ns_pid: u32) -> PathBuf {
        self.control_dir
            .join(format!("cuinterpose-{}-{ns_pid}.sock", self.pid_namespace))
    }
}

/// Inode of this process's PID namespace (`/proc/self/ns/pid` names it `pid:[<inode>]`); 0 when it
/// cannot be read.
pub fn own_pid_namespace() -> u64 {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            let l = l.to_str()?.to_string();
            l.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
        })
        .unwrap_or(0)
}

/// Everything the shim takes from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShimConfig {
    /// Directory of the control sockets; `None`: the user's private directory
    /// (`transport::files::default_private_dir`), made by the runtime at start.
    pub control_dir: Option<PathBuf>,
    /// The most verbose log level written ([`log::Level`] as a number, 0 for off).
    pub log_level: u8,
    /// How copies reach the host carrier.
    pub copy: CopyConfig,
    /// Who makes `cuMemAlloc` memory.
    pub alloc: AllocMode,
}

/// A variable whose value was not understood; its default was used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not {expected}; using {default}")]
pub struct Invalid {
    pub name: &'static str,
    pub value: String,
    pub expected: &'static str,
    pub default: &'static str,
}

impl ShimConfig {
    /// Every variable the shim reads.
    pub const SETTINGS: &'static [Setting] = &[
        CONTROL_DIR,
        LOG,
        CARRIER,
        STAGING_CHUNK,
        CARRIER_RELEASE,
        ALLOC,
    ];

    /// The configuration of this process's environment.
    pub fn from_env() -> (ShimConfig, Vec<Invalid>) {
        ShimConfig::from_lookup(|name| std::env::var_os(name))
    }

    /// The configuration `lookup` gives (a variable's value, `None` when unset), and the values
    /// that were not understood.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> (ShimConfig, Vec<Invalid>) {
        let mut reader = Reader {
            lookup,
            invalid: Vec::new(),
        };
        let config = ShimConfig {
            control_dir: reader.raw(&CONTROL_DIR).map(PathBuf::from),
            // A filter valid for the tool but naming nothing of the shim keeps the default.
            log_level: reader
                .parse(&LOG, LOG_EXPECTED, |v| log::parse_filter(v).ok())
                .flatten()
                .unwrap_or(log::Level::Warn as u8),
            copy: CopyConfig {
                carrier: reader
                    .parse(&CARRIER, CARRIER_EXPECTED, carrier_policy)
                    .unwrap_or_default(),
                chunk: reader
                    .parse(&STAGING_CHUNK, CHUNK_EXPECTED, staging_chunk)
                    .unwrap_or(DEFAULT_CHUNK),
                release: reader
                    .parse(&CARRIER_RELEASE, RELEASE_EXPECTED, carrier_release)
                    .unwrap_or_default(),
            },
            alloc: reader
                .parse(&ALLOC, ALLOC_EXPECTED, alloc_mode)
                .unwrap_or_default(),
        };
        (config, reader.invalid)
    }
}

/// Reads variables through a lookup and collects the values it could not parse.
struct Reader<F> {
    lookup: F,
    invalid: Vec<Invalid>,
}

impl<F: Fn(&str) -> Option<OsString>> Reader<F> {
    /// The value of `setting`; `None` when unset or empty.
    fn raw(&self, setting: &Setting) -> Option<OsString> {
        (self.lookup)(setting.name).filter(|v| !v.is_empty())
    }

    /// The parsed value of `setting`; `None` when unset, empty, not UTF-8 or not understood (the
    /// last two recorded as invalid).
    fn parse<T>(
        &mut self,
        setting: &Setting,
        expected: &'static str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Option<T> {
        let raw = self.raw(setting)?;
        let parsed = raw.to_str().and_then(parse);
        if parsed.is_none() {
            self.invalid.push(Invalid {
                name: setting.name,
                value: raw.to_string_lossy().into_owned(),
                expected,
                default: setting.default,
            });
        }
        parsed
    }
}

const LOG_EXPECTED: &str = "a level (error, warn, info, debug, trace, off) or a filter list";
const CARRIER_EXPECTED: &str = "auto, staged, registered or pinned";
const RELEASE_EXPECTED: &str = "never or after-resume";
const ALLOC_EXPECTED: &str = "vmm or native";
const CHUNK_EXPECTED: &str = "a multiple of 4K from 256K to 64M";

/// `auto` (the default: staged for cycles with a native checkpoint, pinned from the first that
/// skips it; the copy engine (`cuinterpose-copy`) says why), or one mode for every cycle: `staged`,
/// `registered` (slowest on the H200: 16-19 GB/s, its per-cycle `cuMemHostRegister` costing more
/// than the copy) or `pinned`.
fn carrier_policy(value: &str) -> Option<CarrierPolicy> {
    match value.trim() {
        "auto" => Some(CarrierPolicy::Auto),
        "staged" => Some(CarrierPolicy::Always(CarrierMode::Staged)),
        "registered" => Some(CarrierPolicy::Always(CarrierMode::Registered)),
        "pinned" => Some(CarrierPolicy::Always(CarrierMode::Pinned)),
        _ => None,
    }
}

/// When a pinned carrier is given back: `never` or `after-resume`.
fn carrier_release(value: &str) -> Option<CarrierRelease> {
    match value.trim() {
        "never" => Some(CarrierRelease::Never),
        "after-resume" => Some(CarrierRelease::AfterResume),
        _ => None,
    }
}

/// `vmm` (the default: the shim serves legacy CUDA IPC of owned memory itself, `ipc.rs`) or
/// `native`.
fn alloc_mode(value: &str) -> Option<AllocMode> {
    match value.trim() {
        "vmm" => Some(AllocMode::Vmm),
        "native" => Some(AllocMode::Native),
        _ => None,
    }
}

/// A staging buffer size: bytes, or with a `K`/`M` suffix, in [`CHUNK_RANGE`] and a multiple of
/// 4 KiB.
fn staging_chunk(value: &str) -> Option<usize> {
    let text = value.trim();
    let (digits, unit) = match text.strip_suffix(['K', 'k']) {
        Some(d) => (d, 1 << 10),
        None => match text.strip_suffix(['M', 'm']) {
            Some(d) => (d, 1 << 20),
            None => (text, 1),
        },
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .filter(|n| CHUNK_RANGE.contains(n) && n.is_multiple_of(CHUNK_ALIGN))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    fn with(vars: &[(&str, &str)]) -> (ShimConfig, Vec<Invalid>) {
        let vars: BTreeMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        ShimConfig::from_lookup(|name| vars.get(name).cloned())
    }

    fn policy_from(value: Option<&str>) -> CarrierPolicy {
        with(
            &value
                .map(|v| (CARRIER.name, v))
                .into_iter()
                .collect::<Vec<_>>(),
        )
        .0
        .copy
        .carrier
    }

    fn chunk_from(value: Option<&str>) -> usize {
        with(
            &value
                .map(|v| (STAGING_CHUNK.name, v))
                .into_iter()
                .collect::<Vec<_>>(),
        )
        .0
        .copy
        .chunk
    }

    #[test]
    fn the_carrier_knob_names_a_mode() {
        let always = CarrierPolicy::Always;
        assert_eq!(policy_from(None), CarrierPolicy::Auto);
        assert_eq!(policy_from(Some("")), CarrierPolicy::Auto);
        assert_eq!(policy_from(Some("auto")), CarrierPolicy::Auto);
        assert_eq!(
            policy_from(Some("registered")),
            always(CarrierMode::Registered)
        );
        assert_eq!(policy_from(Some("staged")), always(CarrierMode::Staged));
        assert_eq!(policy_from(Some("pinned")), always(CarrierMode::Pinned));
        assert_eq!(policy_from(Some("mapped")), CarrierPolicy::Auto);
    }

    #[test]
    fn the_staging_chunk_knob_parses_or_keeps_the_default() {
        assert_eq!(chunk_from(None), DEFAULT_CHUNK);
        assert_eq!(chunk_from(Some("")), DEFAULT_CHUNK);
        assert_eq!(chunk_from(Some("2M")), 2 << 20);
        assert_eq!(chunk_from(Some("512k")), 512 << 10);
        assert_eq!(chunk_from(Some("8388608")), 8 << 20);
        for bad in [
            "0",
            "4K",
            "128M",
            "1000",
            "2X",
            "-1M",
            "18446744073709551615M",
        ] {
            assert_eq!(chunk_from(Some(bad)), DEFAULT_CHUNK, "{bad}");
        }
    }

    #[test]
    fn values_are_parsed_and_invalid_ones_named_with_the_default_used() {
        let (config, invalid) = with(&[
            ("CUINTERPOSE_CONTROL_DIR", "/run/cui"),
            ("CUINTERPOSE_LOG", "hyper=trace,cuinterpose=debug"),
            ("CUINTERPOSE_CARRIER", "registered"),
            ("CUINTERPOSE_STAGING_CHUNK", "8M"),
            ("CUINTERPOSE_CARRIER_RELEASE", "after-resume"),
            ("CUINTERPOSE_ALLOC", "native"),
        ]);
        assert!(invalid.is_empty(), "{invalid:?}");
        assert_eq!(
            config,
            ShimConfig {
                control_dir: Some(PathBuf::from("/run/cui")),
                log_level: log::Level::Debug as u8,
                copy: CopyConfig {
                    carrier: CarrierPolicy::Always(CarrierMode::Registered),
                    chunk: 8 << 20,
                    release: CarrierRelease::AfterResume,
                },
                alloc: AllocMode::Native,
            }
        );

        let (config, invalid) = with(&[
            ("CUINTERPOSE_LOG", "loud"),
            ("CUINTERPOSE_CARRIER", "mapped"),
            ("CUINTERPOSE_STAGING_CHUNK", "3K"),
            ("CUINTERPOSE_CARRIER_RELEASE", "sometimes"),
            ("CUINTERPOSE_ALLOC", "both"),
        ]);
        assert_eq!(config, with(&[]).0);
        let names: Vec<&str> = invalid.iter().map(|i| i.name).collect();
        assert_eq!(
            names,
            [
                "CUINTERPOSE_LOG",
                "CUINTERPOSE_CARRIER",
                "CUINTERPOSE_STAGING_CHUNK",
                "CUINTERPOSE_CARRIER_RELEASE",
                "CUINTERPOSE_ALLOC"
            ]
        );
        assert_eq!(
            invalid[1].to_string(),
            "CUINTERPOSE_CARRIER=\"mapped\" is not auto, staged, registered or pinned; using auto"
        );

        // A value that is not UTF-8 is invalid too; a control directory need not be UTF-8.
        use std::os::unix::ffi::OsStringExt;
        let odd = OsString::from_vec(vec![b'/', 0xff]);
        let (config, invalid) = ShimConfig::from_lookup(|name| {
            matches!(name, "CUINTERPOSE_CARRIER" | "CUINTERPOSE_CONTROL_DIR").then(|| odd.clone())
        });
        assert_eq!(config.control_dir, Some(PathBuf::from(odd.clone())));
        assert_eq!(config.copy.carrier, CarrierPolicy::Auto);
        assert_eq!(invalid.len(), 1);
        assert_eq!(invalid[0].name, "CUINTERPOSE_CARRIER");
    }

    #[test]
    fn the_listed_defaults_are_the_defaults_and_only_listed_variables_are_read() {
        let asked = RefCell::new(Vec::new());
        let (unset, invalid) = ShimConfig::from_lookup(|name| {
            asked.borrow_mut().push(name.to_string());
            None
        });
        assert!(invalid.is_empty());
        let mut asked = asked.into_inner();
        asked.sort();
        let mut listed: Vec<String> = ShimConfig::SETTINGS
            .iter()
            .map(|s| s.name.to_string())
            .collect();
        listed.sort();
        assert_eq!(asked, listed);
        // Setting every variable whose default is a value to that default changes nothing (the
        // control directory's default is a rule: the user's private directory).
        assert_eq!(unset.control_dir, None);
        let (explicit, invalid) = ShimConfig::from_lookup(|name| {
            ShimConfig::SETTINGS
                .iter()
                .find(|s| s.name == name && s.name != CONTROL_DIR.name)
                .map(|s| OsString::from(s.default))
        });
        assert!(invalid.is_empty(), "{invalid:?}");
        assert_eq!(explicit, unset);
    }
}
