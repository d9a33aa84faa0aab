//! Configuration from the environment, read once at the first `cuInit`.

use std::path::PathBuf;

use cuda_abi::CUresult;

use crate::Res;

/// Most devices a fake machine may have (`FAKE_CUDA_DEVICES`).
pub(crate) const MAX_DEVICES: u32 = 64;
const GIB: u64 = 1 << 30;

/// What `FAKE_CUDA_*` variables asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Config {
    pub devices: u32,
    pub device_memory: u64,
    pub state_dir: PathBuf,
    pub multicast: bool,
    pub fabric: bool,
}

/// The state directory when `FAKE_CUDA_STATE_DIR` is unset: `/tmp/fake-cuda-<uid>`.
pub(crate) fn state_dir_from_env() -> PathBuf {
    match std::env::var_os("FAKE_CUDA_STATE_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(format!("/tmp/fake-cuda-{}", crate::os::getuid())),
    }
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Parses a byte count: a plain number, or one with a `K`/`M`/`G`/`T` (or `KiB`...) suffix.
pub(crate) fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: u64 = number.parse().ok()?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

fn parse_flag(name: &str, default: bool) -> Res<bool> {
    match var(name).as_deref().map(str::trim) {
        None => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => {
            eprintln!("fake-cuda: {name}={other:?} is not 0 or 1");
            Err(CUresult::ERROR_INVALID_VALUE)
        }
    }
}

impl Config {
    /// Reads the environment. A malformed value fails `cuInit` with `CUDA_ERROR_INVALID_VALUE`
    /// (and a line on stderr) rather than running with a configuration nobody asked for.
    pub(crate) fn from_env() -> Res<Config> {
        let devices = match var("FAKE_CUDA_DEVICES") {
            None => 2,
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n) if n <= MAX_DEVICES => n,
                _ => {
                    eprintln!(
                        "fake-cuda: FAKE_CUDA_DEVICES={v:?} is not a number 0..={MAX_DEVICES}"
                    );
                    return Err(CUresult::ERROR_INVALID_VALUE);
                }
            },
        };
        let device_memory = match var("FAKE_CUDA_DEVICE_MEMORY") {
            None => 8 * GIB,
            Some(v) => match parse_bytes(&v) {
                Some(n) if n >= crate::memory::GRANULARITY => n,
                _ => {
                    eprintln!(
                        "fake-cuda: FAKE_CUDA_DEVICE_MEMORY={v:?} is not a size of at least 2 MiB"
                    );
                    return Err(CUresult::ERROR_INVALID_VALUE);
                }
            },
        };
        Ok(Config {
            devices,
            device_memory,
            state_dir: state_dir_from_env(),
            multicast: parse_flag("FAKE_CUDA_MULTICAST", true)?,
            fabric: parse_flag("FAKE_CUDA_FABRIC", true)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("8G"), Some(8 << 30));
        assert_eq!(parse_bytes("512MiB"), Some(512 << 20));
        assert_eq!(parse_bytes(" 2 m "), Some(2 << 20));
        assert_eq!(parse_bytes("2x"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999T"), None);
    }
}
