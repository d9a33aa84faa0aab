//! Communicators: initialisation (rendezvous in the shared region), all-reduce (kernels enqueued
//! on the caller's stream) and teardown.

use std::ffi::c_char;
use std::sync::Mutex;
use std::time::Duration;

use cuda_abi::{CUdevice, CUstream};

use crate::abi::{Element, NcclUniqueId, UNIQUE_ID_BYTES};
use crate::driver::{Driver, Kernels, driver};
use crate::error::NcclError;
use crate::layout::{Layout, MAX_RANKS, SLOT_BYTES, SLOTS};
use crate::plan::AllReduce;
use crate::region::Region;

/// The first bytes of every unique id this library makes.
const ID_MAGIC: &[u8; 8] = b"FKNCCL01";
/// Random bytes after the magic: they name the region.
const ID_RANDOM: usize = 16;

/// How long `ncclCommInitRank` waits for every rank: `FAKE_NCCL_INIT_TIMEOUT` seconds, 60 if
/// unset.
fn init_timeout() -> Result<Duration, NcclError> {
    match std::env::var("FAKE_NCCL_INIT_TIMEOUT") {
        Err(_) => Ok(Duration::from_secs(60)),
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!(
                    "FAKE_NCCL_INIT_TIMEOUT={text:?} is not a number of seconds"
                ))
            }),
    }
}

/// A new unique id: the magic, 16 random bytes, zeroes.
pub fn new_unique_id() -> Result<NcclUniqueId, NcclError> {
    let mut bytes = [0u8; UNIQUE_ID_BYTES];
    bytes[..ID_MAGIC.len()].copy_from_slice(ID_MAGIC);
    let random = &mut bytes[ID_MAGIC.len()..ID_MAGIC.len() + ID_RANDOM];
    // SAFETY: writes at most `random.len()` bytes into it.
    let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    if got != ID_RANDOM as isize {
        let e = std::io::Error::last_os_error();
        return Err(NcclError::system("getrandom", e));
    }
    Ok(NcclUniqueId {
        internal: bytes.map(|b| b as c_char),
    })
}

/// The region's file name for a unique id: `nccl-<32 hex digits>`.
pub fn region_name(id: &NcclUniqueId) -> Result<String, NcclError> {
    let bytes = id.internal.map(|c| c as u8);
    if &bytes[..ID_MAGIC.len()] != ID_MAGIC {
        return Err(NcclError::InvalidArgument(
            "the unique id was not made by ncclGetUniqueId of this library".into(),
        ));
    }
    let random = &bytes[ID_MAGIC.len()..ID_MAGIC.len() + ID_RANDOM];
    Ok(format!(
        "nccl-{}",
        random
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    ))
}

#[derive(Debug)]
struct State {
    /// The last collective enqueued (0: none).
    last: u32,
    /// A launch failed part-way through a collective: its peers may wait forever, and this
    /// rank's flags will never reach `last`.
    broken: bool,
}

/// One rank's communicator.
#[derive(Debug)]
pub struct Comm {
    pub nranks: u32,
    pub rank: u32,
    pub device: CUdevice,
    driver: &'static Driver,
    kernels: Kernels,
    region: Region,
    state: Mutex<State>,
}

impl Comm {
    /// `ncclCommInitRank`: joins the unique id's communicator as `rank` of `nranks`, in the
    /// current context, once every rank has joined.
    pub fn init(id: &NcclUniqueId, nranks: i32, rank: i32) -> Result<Comm, NcclError> {
        let nranks = u32::try_from(nranks)
            .ok()
            .filter(|n| (1..=MAX_RANKS).contains(n))
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!("nranks {nranks} is not in 1..={MAX_RANKS}"))
            })?;
        let rank = u32::try_from(rank)
            .ok()
            .filter(|&r| r < nranks)
            .ok_or_else(|| {
                NcclError::InvalidArgument(format!("rank {rank} is not in 0..{nranks}"))
            })?;
        let name = region_name(id)?;
        let timeout = init_timeout()?;
        let driver = driver()?;
        let (_, device) = driver.current()?;
        let kernels = driver.load_kernels()?;
        let region = match Region::join(&name, nranks, rank) {
            Ok(region) => region,
            Err(e) => {
                driver.unload(&kernels);
                return Err(e);
            }
        };
        let ready = driver
            .register(region.base(), region.size())
            .and_then(|()| {
                region.wait_for_all(timeout).inspect_err(|_| {
                    // Registered just above; undone with the failed join.
                    let _ = driver.unregister(region.base());
                })
            });
        if let Err(e) = ready {
            region.withdraw(rank);
            driver.unload(&kernels);
            return Err(e);
        }
        Ok(Comm {
            nranks,
            rank,
            device,
            driver,
            kernels,
            region,
            state: Mutex::new(State {
                last: 0,
                broken: false,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic cannot leave `State` half-written (two plain fields); keep going.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ncclAllReduce`: enqueues the collective's kernels on `stream`.
    pub fn all_reduce(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        datatype: i32,
        op: i32,
        stream: CUstream,
    ) -> Result<(), NcclError> {
        let element = Element::of(datatype, op).ok_or_else(|| {
            NcclError::InvalidArgument(format!(
                "datatype {datatype} with op {op}: only ncclSum of ncclInt32, ncclUint32 and \
                 ncclFloat32 is implemented"
            ))
        })?;
        if count == 0 {
            // As real NCCL: nothing to reduce, nothing enqueued (every rank passes the same count).
            return Ok(());
        }
        let bytes = (count as u64).checked_mul(element.size());
        if bytes.is_none_or(|b| b > SLOT_BYTES) {
            return Err(NcclError::InvalidArgument(format!(
                "count {count}: this library reduces at most {SLOT_BYTES} bytes per call"
            )));
        }
        if send == 0 || recv == 0 {
            return Err(NcclError::InvalidArgument("null buffer".into()));
        }
        let mut state = self.state();
        if state.broken {
            return Err(NcclError::InvalidUsage(
                "an earlier collective of this communicator failed to enqueue".into(),
            ));
        }
        let seq = state.last.checked_add(1).ok_or_else(|| {
            NcclError::InvalidUsage("this communicator has run out of sequence numbers".into())
        })?;
        let plan = AllReduce {
            layout: self.layout(),
            base: self.region.base() as u64,
            rank: self.rank,
            seq,
            send,
            recv,
            count: count as u64,
            element,
        };
        for (index, kernel) in plan.kernels().iter().enumerate() {
            if let Err(e) = self.driver.launch(&self.kernels, stream, kernel) {
                // Nothing enqueued yet leaves the communicator as it was.
                state.broken = index > 0;
                return Err(e);
            }
        }
        state.last = seq;
        Ok(())
    }

    fn layout(&self) -> Layout {
        self.region.layout()
    }

    /// Whether every collective enqueued has finished touching the region: the last one of each
    /// slot has (an earlier user of a slot finished before the next one could start, step 1 of
    /// [`crate::plan`]).
    fn quiet(&self, state: &State) -> bool {
        let first = state.last.saturating_sub(SLOTS as u32 - 1).max(1);
        !state.broken && (first..=state.last).all(|seq| self.region.done(self.rank, seq) >= seq)
    }

    /// `ncclCommDestroy`: waits until this rank's collectives are done (as `ncclCommFinalize`
    /// does; forever if a peer never joins one), then releases the region and the module. A
    /// broken communicator (a collective enqueued in part) is aborted instead: its queued
    /// kernels may never finish.
    pub fn destroy(self) {
        let state = self.state();
        if state.broken {
            drop(state);
            return self.abort();
        }
        while !self.quiet(&state) {
            std::thread::sleep(Duration::from_micros(200));
        }
        drop(state);
        self.release();
    }

    /// `ncclCommAbort`: returns at once. The fake driver cannot stop a queued kernel, so when
    /// some still may touch the region, the mapping, its registration and the module are left
    /// in place for good.
    pub fn abort(self) {
        let quiet = self.quiet(&self.state());
        if quiet {
            self.release();
        } else {
            self.region.leave();
            std::mem::forget(self);
        }
    }

    fn release(self) {
        // Failures here leave a registration or module behind, which harms nothing once the
        // mapping is gone; NCCL's destroy also reports only its own errors.
        let _ = self.driver.unregister(self.region.base());
        self.driver.unload(&self.kernels);
        self.region.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_ids_name_distinct_regions() {
        let a = new_unique_id().unwrap();
        let b = new_unique_id().unwrap();
        let (na, nb) = (region_name(&a).unwrap(), region_name(&b).unwrap());
        assert_ne!(na, nb);
        assert_eq!(na.len(), "nccl-".len() + 2 * ID_RANDOM);
        assert!(
            a.internal[ID_MAGIC.len() + ID_RANDOM..]
                .iter()
                .all(|&c| c == 0)
        );
        let foreign = NcclUniqueId {
            internal: [1; UNIQUE_ID_BYTES],
        };
        assert!(matches!(
            region_name(&foreign),
            Err(NcclError::InvalidArgument(_))
        ));
    }

    #[test]
    fn bad_ranks_are_refused_before_the_driver_is_touched() {
        let id = new_unique_id().unwrap();
        for (nranks, rank) in [(0, 0), (-1, 0), (65, 0), (2, 2), (2, -1)] {
            assert!(
                matches!(
                    Comm::init(&id, nranks, rank),
                    Err(NcclError::InvalidArgument(_))
                ),
                "{nranks} {rank}"
            );
        }
    }
}
