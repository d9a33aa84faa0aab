//! Device memory accounting across processes.
//!
//! Each initialised process publishes its usage in `$FAKE_CUDA_STATE_DIR/usage-<pid>-<start>`
//! (`start`: the process start time from `/proc/<pid>/stat`, so a recycled pid is never
//! confused with a dead process). The owner holds an exclusive `flock` on its file for as long as
//! the numbers are live; a reader counts a file only while that lock is held, and removes files
//! that nobody locks and whose owner (pid and start token) is not alive here. The lock alone
//! decides for an owner in another PID namespace, whose pid means another process here. A checkpointed process removes its file and closes it (it holds no
//! descriptor of the fake then); its usage is 0 until restore publishes it again.
//!
//! File format (text, ASCII, rewritten in place with one `pwrite`; byte counts are zero-padded
//! to 20 digits so the file never changes length):
//!
//! ```text
//! fake-cuda-usage 1
//! pid <pid>
//! start <start token>
//! devices <n>
//! device <ordinal> <bytes, 20 digits>     (n lines, ordinal 0..n)
//! ```

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::os;
use crate::state::Driver;

const HEADER: &str = "fake-cuda-usage 1";

/// Creates the state directory (mode 0700) if it does not exist.
pub(crate) fn ensure_dir(dir: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn flock(file: &File, op: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on an open descriptor has no memory effects.
    if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// One process's published usage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageRecord {
    pub pid: u32,
    pub start: u64,
    /// Bytes charged per device ordinal.
    pub devices: Vec<u64>,
}

/// Renders a usage file.
pub fn render(record: &UsageRecord) -> String {
    let mut out = format!(
        "{HEADER}\npid {}\nstart {}\ndevices {}\n",
        record.pid,
        record.start,
        record.devices.len()
    );
    for (i, bytes) in record.devices.iter().enumerate() {
        out.push_str(&format!("device {i} {bytes:020}\n"));
    }
    out
}

/// Parses a usage file; `None` for anything malformed.
pub fn parse(text: &str) -> Option<UsageRecord> {
    let mut lines = text.lines();
    if lines.next()? != HEADER {
        return None;
    }
    let mut field = |name: &str| -> Option<u64> {
        let line = lines.next()?;
        let (key, value) = line.split_once(' ')?;
        (key == name).then(|| value.trim().parse().ok())?
    };
    let pid = u32::try_from(field("pid")?).ok()?;
    let start = field("start")?;
    let n = usize::try_from(field("devices")?).ok()?;
    if n > crate::config::MAX_DEVICES as usize {
        return None;
    }
    let mut devices = Vec::with_capacity(n);
    for i in 0..n {
        let line = lines.next()?;
        let mut parts = line.split(' ');
        if parts.next()? != "device" || parts.next()?.parse::<usize>().ok()? != i {
            return None;
        }
        devices.push(parts.next()?.parse().ok()?);
    }
    Some(UsageRecord {
        pid,
        start,
        devices,
    })
}

/// The live usage records in `dir`. Files of dead owners are removed on the way.
pub fn read_live(dir: &Path) -> Vec<UsageRecord> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("usage-") else {
            continue;
        };
        let Some((pid, start)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else {
            continue;
        };
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        let locked = flock(&file, libc::LOCK_SH | libc::LOCK_NB).is_err();
        let owner_here = os::start_token(pid) == Some(start);
        if !owner_here && !locked {
            // Nobody holds the owner's lock and no process of ours is the owner: gone.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if !locked {
            // The owner lives but holds no lock: it is between checkpoint and restore, or still
            // creating the file. Not live, and not ours to remove.
            continue;
        }
        // Locked: the owner is ours (pid and start token match), or a process of another PID
        // namespace, where the pid in the name is its own and means another process here, or
        // nothing (a `cuinterpose run --pid-namespace` group seen from the tool). Its lock is
        // what says it lives (the descriptor is close-on-exec; a child forked without exec would
        // keep it, which the workloads do not do).
        let mut buf = vec![0u8; 4096];
        let Ok(n) = file.read_at(&mut buf, 0) else {
            continue;
        };
        let text = String::from_utf8_lossy(buf.get(..n).unwrap_or_default());
        if let Some(record) = parse(&text) {
            out.push(record);
        }
    }
    out
}

/// Bytes used on `device` by live processes: one process (`pid > 0`) or all (`pid <= 0`), one
/// device (`device >= 0`) or all (`device < 0`).
pub fn usage_in(dir: &Path, pid: i32, device: i32) -> u64 {
    read_live(dir)
        .iter()
        .filter(|r| pid <= 0 || r.pid as i32 == pid)
        .map(|r| match usize::try_from(device) {
            Ok(dev) => r.devices.get(dev).copied().unwrap_or(0),
            Err(_) => r.devices.iter().sum(),
        })
        .sum()
}

/// The file this process publishes to.
#[derive(Debug)]
pub(crate) struct Publisher {
    dir: PathBuf,
    pid: i32,
    start: u64,
    path: PathBuf,
    file: Option<File>,
}

impl Publisher {
    pub(crate) fn create(dir: &Path, pid: i32, start: u64, devices: u32) -> io::Result<Publisher> {
        let mut p = Publisher {
            dir: dir.to_owned(),
            pid,
            start,
            path: PathBuf::new(),
            file: None,
        };
        p.open(start, &vec![0; devices as usize])?;
        Ok(p)
    }

    /// (Re)creates the file under start token `start` and publishes `usage`.
    pub(crate) fn open(&mut self, start: u64, usage: &[u64]) -> io::Result<()> {
        self.start = start;
        self.path = self.dir.join(format!("usage-{}-{start}", self.pid));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&self.path)?;
        flock(&file, libc::LOCK_EX | libc::LOCK_NB)?;
        self.file = Some(file);
        self.publish(usage);
        Ok(())
    }

    /// Rewrites the numbers. A failing write only makes the accounting stale, which the next
    /// update repairs; it never fails the driver call that charged memory.
    pub(crate) fn publish(&mut self, usage: &[u64]) {
        if let Some(file) = &self.file {
            let text = render(&UsageRecord {
                pid: self.pid as u32,
                start: self.start,
                devices: usage.to_vec(),
            });
            let _ = file.write_all_at(text.as_bytes(), 0);
        }
    }

    /// Removes the file and closes it (checkpoint).
    pub(crate) fn withdraw(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// This process's per-device usage and its publication.
#[derive(Debug)]
pub(crate) struct Usage {
    publisher: Publisher,
    pub bytes: Vec<u64>,
}

impl Usage {
    pub(crate) fn new(publisher: Publisher, devices: usize) -> Usage {
        Usage {
            publisher,
            bytes: vec![0; devices],
        }
    }

    pub(crate) fn charge(&mut self, device: usize, n: u64) {
        if let Some(b) = self.bytes.get_mut(device) {
            *b = b.saturating_add(n);
        }
        self.publisher.publish(&self.bytes);
    }

    pub(crate) fn uncharge(&mut self, device: usize, n: u64) {
        if let Some(b) = self.bytes.get_mut(device) {
            *b = b.saturating_sub(n);
        }
        self.publisher.publish(&self.bytes);
    }

    /// Publishes nothing and holds no descriptor (checkpointed).
    pub(crate) fn withdraw(&mut self) {
        self.publisher.withdraw();
    }

    /// Publishes again after restore, with usage moved between devices by `map` (old -> new).
    pub(crate) fn reinstate(&mut self, start: u64, map: &[usize]) -> io::Result<()> {
        let mut moved = vec![0u64; self.bytes.len()];
        for (old, &n) in self.bytes.iter().enumerate() {
            let new = map.get(old).copied().unwrap_or(old);
            if let Some(slot) = moved.get_mut(new) {
                *slot += n;
            }
        }
        self.bytes = moved;
        let bytes = self.bytes.clone();
        self.publisher.open(start, &bytes)
    }
}

/// Free bytes on `device`: its total less what every live process (this one included) uses.
pub(crate) fn free_bytes(d: &Driver, device: usize) -> u64 {
    let total = d.devices.get(device).map_or(0, |dev| dev.total);
    let own = d.usage.bytes.get(device).copied().unwrap_or(0);
    let others: u64 = read_live(&d.config.state_dir)
        .iter()
        .filter(|r| r.pid as i32 != d.pid)
        .map(|r| r.devices.get(device).copied().unwrap_or(0))
        .sum();
    total.saturating_sub(own).saturating_sub(others)
}

/// `cuMemGetInfo`: (free, total) of the current context's device.
pub(crate) fn mem_info() -> crate::Res<(u64, u64)> {
    crate::state::with(|d| {
        let (_, device) = crate::device::current(d)?;
        let total = d.devices.get(device).map_or(0, |dev| dev.total);
        Ok((free_bytes(d, device), total))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_files_round_trip() {
        let r = UsageRecord {
            pid: 31337,
            start: 987_654,
            devices: vec![0, 2 << 20, 8 << 30],
        };
        let text = render(&r);
        assert_eq!(parse(&text), Some(r.clone()));
        let bigger = UsageRecord {
            devices: vec![1, 2, 3],
            ..r
        };
        assert_eq!(render(&bigger).len(), text.len(), "fixed width");
        assert_eq!(parse("fake-cuda-usage 2\n"), None);
        assert_eq!(parse(&text.replace("device 1", "device 5")), None);
    }

    #[test]
    fn dead_owners_are_ignored_and_removed_live_ones_counted() {
        let dir = std::env::temp_dir().join(format!("fake-cuda-acct-{}", std::process::id()));
        ensure_dir(&dir).unwrap();
        // A file whose owner does not exist (pid 0 is never a process of ours).
        let stale = dir.join("usage-999999999-1");
        std::fs::write(
            &stale,
            render(&UsageRecord {
                pid: 999_999_999,
                start: 1,
                devices: vec![5],
            }),
        )
        .unwrap();
        let me = std::process::id() as i32;
        let start = os::start_token(me).unwrap();
        let mut p = Publisher::create(&dir, me, start, 2).unwrap();
        p.publish(&[3 << 20, 4 << 20]);
        assert_eq!(usage_in(&dir, me, 0), 3 << 20);
        assert_eq!(usage_in(&dir, me, -1), 7 << 20);
        assert_eq!(usage_in(&dir, 0, 1), 4 << 20);
        assert!(!stale.exists(), "a dead owner's file is removed");
        p.withdraw();
        assert_eq!(usage_in(&dir, me, -1), 0);
        drop(p);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
