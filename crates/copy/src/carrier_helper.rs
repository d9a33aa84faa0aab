//! The carrier helper: a process that is never checkpointed and holds, pinned, the host carriers
//! of the processes that save through it (`cuinterpose suspend --carrier helper`).
//!
//! Why (docs/design.md, "Where the pinned carrier lives"): a carrier pinned inside the
//! application moves at the link's rate but makes the driver's own checkpoint and restore of the
//! application slower (it re-pins the registration), so by default a cycle with a native
//! checkpoint copies staged. Here the pinned memory belongs to another process: at Save the shim
//! sends the helper a descriptor of each allocation it made ([`Request::CarrierItem`]); the helper
//! imports it, maps it, DMAs it into that process's carrier at the offset the shim chose, unmaps
//! it and releases the import before it answers ([`Request::CarrierCopy`]), so nothing of the
//! application's memory is held here when its native lock comes. At Load the shim sends the
//! fresh allocations and the helper copies back. Carriers stay pinned between cycles (the whole
//! gain) until the process gives its carrier back ([`Request::CarrierForget`]) or exits.
//!
//! One helper serves one control directory (`cuinterpose-carrier.sock` in it) and every device:
//! it keeps a reference to the primary context of each device for its whole life (its pinned
//! memory is registered through one) and gives the local memory of their stacks back at once (it
//! never launches a kernel). Each caller is known by its pid (`SO_PEERCRED`, same uid or root);
//! a caller's items are mapped on the device whose UUID the shim sent, since the helper's device
//! ordinals need not be the application's. A reaper drops the carriers of processes that have
//! exited, and the helper exits once it has held no carrier for [`HelperConfig::idle`].
//!
//! The price, and why it is opt-in: between Save and Load the helper holds the only copy of the
//! bytes, and its contexts stay on the GPUs while the group is suspended.

use crate::engine::{self as copy, Carrier, CarrierPolicy, Direction, Unit};
use crate::log::{log_info, log_warn};
use cuda::DriverHandle;
use cuda::DriverTable as Real;
use cuda_abi::{CUmemAccessDesc, CUmemLocation, access_flags, limit, location_type};
use protocol::message::CarrierMode;
use protocol::{ErrorCode, Request, Response};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use transport::{Connection, Listener};

pub use protocol::message::CARRIER_HELPER_SOCKET as SOCKET_NAME;

/// How the helper runs (its command line).
#[derive(Debug, Clone)]
pub struct HelperConfig {
    /// The socket to listen on.
    pub socket: PathBuf,
    /// How long the helper waits, holding no carrier, before it exits.
    pub idle: Duration,
}

/// Why the helper could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("the driver failed: {0}")]
    Driver(#[from] cuda::CudaError),
    #[error(transparent)]
    Copy(#[from] copy::CopyError),
    #[error("the helper's socket: {0}")]
    Transport(#[from] transport::TransportError),
    #[error("cannot open the socket's directory or start the reaper: {0}")]
    Spawn(std::io::Error),
}

/// Why one request failed (answered to the caller, who reports it).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("{call} failed for {what}: {result}")]
    Driver {
        call: &'static str,
        what: String,
        result: cuda_abi::CUresult,
    },
    #[error(transparent)]
    Copy(#[from] copy::CopyError),
    #[error("{0}")]
    Invalid(String),
    /// The caller's carrier is not here (a Load from a helper that is not the one it saved
    /// through): the caller loads from its own copy ([`Request::CarrierShare`]).
    #[error(
        "no carrier of process {0} here: its bytes were never saved through this helper, or it gave them back"
    )]
    NoCarrier(u32),
}

fn driver(what: impl FnOnce() -> String) -> impl FnOnce(cuda::CudaError) -> RequestError {
    move |e| RequestError::Driver {
        call: e.call,
        what: what(),
        result: e.result,
    }
}

/// One caller's carrier; the lock is held for a whole copy, so one process's copies never
/// overlap while different processes copy in parallel.
type Shared = Arc<Mutex<Carrier>>;

/// The items of one copy mapped ([`Helper::map_items`]): each mapping with its device, and the
/// engine's units over them.
type ItemMaps = (Vec<(cuda::owned::Mapping<'static>, i32)>, Vec<Unit>);

struct Helper {
    real: &'static Real,
    /// Device UUID to this process's ordinal.
    devices: Vec<([u8; 16], i32)>,
    carriers: Mutex<HashMap<u32, Shared>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent (inserts, removes, one copy).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the helper until it has been idle for `config.idle`: initialises the driver, keeps every
/// device's primary context, listens and serves. Returns when it exits on its own.
pub fn serve(real: &'static Real, config: &HelperConfig) -> Result<(), HelperError> {
    // Between a Save and its Load this process holds the only copy of the group's bytes: the
    // kernel's OOM killer is told never to take it (root only; another user's helper keeps the
    // score it inherited).
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", "-1000") {
        log_info!("the OOM score stays as inherited: {e}");
    }
    real.init(0)?;
    let mut devices = Vec::new();
    for ordinal in 0..real.device_count()? {
        let device = real.device_get(ordinal)?;
        // Kept for the life of the process: the carriers are registered through these.
        real.primary_ctx_retain(device)?;
        let _ctx = copy::enter(real, ordinal)?;
        if let Err(e) = real.ctx_set_limit(limit::STACK_SIZE, 0) {
            log_info!("device {ordinal} keeps its stack: {e}");
        }
        devices.push((uuid_bytes(&real.device_uuid(device)?), ordinal));
    }
    let listener = Listener::bind(&config.socket)?;
    let helper = Arc::new(Helper {
        real,
        devices,
        carriers: Mutex::new(HashMap::new()),
    });
    log_info!(
        "carrier helper on {} for {} devices",
        config.socket.display(),
        helper.devices.len()
    );
    // The socket is removed at exit through its directory, held open from now: the tool names
    // it through a participant's `/proc/PID/root` (its mount namespace), which is gone once
    // that process has exited.
    let dir = config
        .socket
        .parent()
        .map(std::fs::File::open)
        .transpose()
        .map_err(HelperError::Spawn)?;
    let socket = match (&dir, config.socket.file_name()) {
        (Some(dir), Some(name)) => {
            use std::os::fd::AsRawFd;
            PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
        }
        _ => config.socket.clone(),
    };
    let reaper = Arc::clone(&helper);
    let idle = config.idle;
    std::thread::Builder::new()
        .name("cuinterpose-reaper".into())
        .spawn(move || {
            // Kept open (moved here) for as long as the helper runs.
            let _dir = dir;
            reaper.reap(idle, &socket)
        })
        .map_err(HelperError::Spawn)?;
    loop {
        let connection = match listener.accept() {
            Ok(c) => c,
            Err(e) => {
                log_warn!("accept: {e}");
                continue;
            }
        };
        let helper = Arc::clone(&helper);
        let spawned = std::thread::Builder::new()
            .name("cuinterpose-carrier".into())
            .spawn(move || helper.connection(connection));
        if let Err(e) = spawned {
            log_warn!("cannot serve a connection: {e}");
        }
    }
}

impl Helper {
    /// Drops the carriers of callers that have exited; exits the process once no carrier has
    /// been held for `idle`.
    fn reap(&self, idle: Duration, socket: &std::path::Path) {
        let mut empty_since = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let gone: Vec<(u32, Shared)> = {
                let mut carriers = lock(&self.carriers);
                let gone: Vec<u32> = carriers
                    .keys()
                    .copied()
                    .filter(|&pid| !alive(pid))
                    .collect();
                gone.into_iter()
                    .filter_map(|pid| carriers.remove(&pid).map(|c| (pid, c)))
                    .collect()
            };
            for (pid, carrier) in gone {
                log_info!("process {pid} exited: its carrier is given back");
                if let Err(e) = lock(&carrier).free(self.real) {
                    log_warn!("the carrier of process {pid} stays mapped: {e}");
                }
            }
            if !lock(&self.carriers).is_empty() {
                empty_since = Instant::now();
            } else if empty_since.elapsed() >= idle {
                log_info!("no carrier held for {idle:?}: exiting");
                let _ = std::fs::remove_file(socket);
                std::process::exit(0);
            }
        }
    }

    /// Serves one caller until it closes the connection.
    fn connection(&self, mut connection: Connection) {
        let pid = match connection.check_peer() {
            Ok(peer) => peer.pid,
            Err(e) => {
                log_warn!("refused a caller: {e}");
                return;
            }
        };
        let mut items: Vec<Item> = Vec::new();
        loop {
            let (request, fd) = match connection.recv_request_with_fd() {
                Ok(r) => r,
                Err(_) => break,
            };
            let mut handed = None;
            let answer = match (request, fd) {
                (
                    Request::CarrierItem {
                        offset,
                        size,
                        device,
                    },
                    Some(fd),
                ) => self.item(fd, offset, size, device).map(|item| {
                    items.push(item);
                    Response::Accepted
                }),
                (Request::CarrierCopy { to_host, total }, _) => {
                    let taken = std::mem::take(&mut items);
                    self.copy(pid, taken, to_host, total)
                        .map(|stats| Response::Copied { stats })
                }
                (Request::CarrierForget, _) => {
                    self.forget(pid);
                    Ok(Response::Accepted)
                }
                (Request::CarrierShare, _) => self.share(pid).map(|(fd, length)| {
                    handed = Some(fd);
                    Response::CarrierFd {
                        length,
                        helper_pid: std::process::id(),
                    }
                }),
                (Request::CarrierPrepare { pid, bytes }, _) => {
                    self.prepare(pid, bytes)
                        .map(|(pinned, took)| Response::Prepared {
                            pinned,
                            micros: took.as_micros().min(u64::MAX as u128) as u64,
                        })
                }
                (other, _) => Err(RequestError::Invalid(format!(
                    "a carrier helper serves carrier requests only, not {other:?}"
                ))),
            };
            let response = answer.unwrap_or_else(|e| Response::Error {
                code: match e {
                    RequestError::Driver { .. } | RequestError::Copy(_) => ErrorCode::Driver,
                    RequestError::Invalid(_) => ErrorCode::Internal,
                    RequestError::NoCarrier(_) => ErrorCode::NotFound,
                },
                message: format!("carrier helper (pid {}): {e}", std::process::id()),
            });
            let fd = match &response {
                Response::CarrierFd { .. } => handed.as_ref().map(|fd| fd.as_fd()),
                _ => None,
            };
            if connection.send_response(&response, fd).is_err() {
                break;
            }
        }
        // Items sent without a copy: their imports go.
        for item in items {
            self.release(item.handle);
        }
    }

    /// Makes process `pid`'s carrier `bytes` long and pins it (in [`copy::PIN_PIECE`] pieces, under
    /// the first device's context; registrations are portable), ahead of its first Save through
    /// this helper, which then finds it pinned (`cuinterpose prepare`). Returns the bytes pinned and
    /// the time it took. The carrier is given back like any other: when the process exits.
    fn prepare(&self, pid: u32, bytes: u64) -> Result<(u64, Duration), RequestError> {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(RequestError::Invalid(format!(
                "no process {pid} to prepare a carrier for"
            )));
        }
        let (shared, made) = {
            let mut carriers = lock(&self.carriers);
            let made = !carriers.contains_key(&pid);
            let shared = carriers
                .entry(pid)
                .or_insert_with(|| Arc::new(Mutex::new(Carrier::shareable())));
            (Arc::clone(shared), made)
        };
        let mut carrier = lock(&shared);
        let len = usize::try_from(bytes).unwrap_or(usize::MAX);
        // A carrier of an earlier cycle may hold the bytes of a suspension in progress: growing
        // it would unmap them. Only a new carrier is made here; an existing one grows at its
        // process's next Save, as it always has.
        if !made && carrier.mapped() < len {
            return Err(RequestError::Invalid(format!(
                "process {pid} already has a carrier of {} bytes; it grows at its next Save",
                carrier.mapped()
            )));
        }
        let device = self.devices.first().map_or(0, |(_, ordinal)| *ordinal);
        let (took, _, pinned) = carrier.ensure_pinned(self.real, len, copy::PIN_PIECE, device)?;
        log_info!("carrier of process {pid} prepared: {bytes} bytes, pinned {pinned}, {took:?}");
        Ok((if pinned { carrier.pinned() as u64 } else { 0 }, took))
    }

    /// Imports one allocation of the caller.
    fn item(
        &self,
        fd: OwnedFd,
        offset: u64,
        size: u64,
        device: [u8; 16],
    ) -> Result<Item, RequestError> {
        let ordinal = self
            .devices
            .iter()
            .find(|(uuid, _)| *uuid == device)
            .map(|(_, o)| *o)
            .ok_or_else(|| {
                RequestError::Invalid(format!(
                    "no device with UUID {} here",
                    device
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<String>()
                ))
            })?;
        let what = || format!("an allocation of {size} bytes");
        let handle = {
            let _ctx = copy::enter(self.real, ordinal)?;
            use std::os::fd::AsFd;
            self.real.mem_import_fd(fd.as_fd()).map_err(driver(what))?
        };
        Ok(Item {
            handle,
            offset: usize::try_from(offset).unwrap_or(usize::MAX),
            size: usize::try_from(size).unwrap_or(usize::MAX),
            ordinal,
        })
    }

    fn release(&self, handle: DriverHandle) {
        if let Err(e) = self.real.mem_release(handle) {
            log_warn!("an imported allocation was not released: {e}");
        }
    }

    /// Copies the items into the caller's carrier (`to_host`: made or grown to `total` bytes and
    /// pinned) or out of it, then unmaps and releases every import.
    fn copy(
        &self,
        pid: u32,
        items: Vec<Item>,
        to_host: bool,
        total: u64,
    ) -> Result<protocol::message::CopyStats, RequestError> {
        let result = self.copy_items(pid, &items, to_host, total);
        for item in items {
            self.release(item.handle);
        }
        result
    }

    fn copy_items(
        &self,
        pid: u32,
        items: &[Item],
        to_host: bool,
        total: u64,
    ) -> Result<protocol::message::CopyStats, RequestError> {
        let carrier = {
            let mut carriers = lock(&self.carriers);
            if !to_host && !carriers.contains_key(&pid) {
                return Err(RequestError::NoCarrier(pid));
            }
            // A memfd, whose descriptor the caller takes after the copy (`share`).
            Arc::clone(
                carriers
                    .entry(pid)
                    .or_insert_with(|| Arc::new(Mutex::new(Carrier::shareable()))),
            )
        };
        let shared = carrier;
        let mut carrier = lock(&shared);
        if carrier.is_poisoned() {
            // A copy of an earlier request could not be confirmed finished: what the carrier
            // holds is not known to be the caller's bytes, and it may still be written.
            return Err(RequestError::Invalid(format!(
                "the carrier of process {pid} is unusable: a copy into or out of it could not be \
                 confirmed finished"
            )));
        }
        let prepared = if to_host {
            let total = usize::try_from(total).unwrap_or(usize::MAX);
            let device = items.first().map_or(0, |i| i.ordinal);
            let (took, reused, _) =
                carrier.ensure_pinned(self.real, total, copy::PIN_PIECE, device)?;
            (took, reused)
        } else {
            (Duration::ZERO, true)
        };
        let end = items.iter().map(|i| i.offset.saturating_add(i.size)).max();
        if end.is_some_and(|end| end > carrier.mapped()) {
            return Err(RequestError::Invalid(format!(
                "items reach {} bytes into a carrier of {}",
                end.unwrap_or(0),
                carrier.mapped()
            )));
        }
        let (maps, units) = self.map_items(items, carrier.base())?;
        let needed = end.unwrap_or(0);
        let mode = CarrierPolicy::Always(CarrierMode::Pinned).mode(needed, carrier.pinned());
        let dir = if to_host {
            Direction::ToHost
        } else {
            Direction::ToDevice
        };
        let (stats, error) = copy::copy_all(self.real, units, dir, mode, copy::DEFAULT_CHUNK);
        if stats.dma_uncertain {
            // A copy may still run: the carrier and the mappings stay as they are for good.
            carrier.poison();
            for (map, _) in maps {
                map.leak();
            }
        } else {
            self.unmap(maps);
        }
        match error {
            Some(e) => Err(e.into()),
            None => Ok(stats.report(prepared)),
        }
    }

    /// Maps each item whole under its device's context, and cuts it into the engine's units at
    /// its offset in the carrier at `base`; on an error the maps made so far are removed again.
    fn map_items(&self, items: &[Item], base: usize) -> Result<ItemMaps, RequestError> {
        let mut maps = Vec::with_capacity(items.len());
        let mut units: Vec<Unit> = Vec::new();
        for item in items {
            let mapped = copy::enter(self.real, item.ordinal)
                .map_err(RequestError::from)
                .and_then(|_ctx| {
                    let access = CUmemAccessDesc {
                        location: CUmemLocation {
                            type_: location_type::DEVICE,
                            id: item.ordinal,
                        },
                        flags: access_flags::PROT_READWRITE,
                    };
                    cuda::owned::Mapping::whole(
                        self.real,
                        item.handle,
                        item.size,
                        &[access],
                        copy::log_cleanup,
                    )
                    .map_err(driver(|| format!("a mapping of {} bytes", item.size)))
                });
            match mapped {
                Ok(map) => {
                    units.extend(copy::segments(
                        item.ordinal,
                        map.va(),
                        base,
                        item.offset,
                        item.size,
                    ));
                    maps.push((map, item.ordinal));
                }
                Err(e) => {
                    self.unmap(maps);
                    return Err(e);
                }
            }
        }
        Ok((maps, units))
    }

    /// Removes mappings under their device's context (one whose context cannot be entered is
    /// kept: never unmapped without its context).
    fn unmap(&self, maps: Vec<(cuda::owned::Mapping<'static>, i32)>) {
        for (map, ordinal) in maps {
            match copy::enter(self.real, ordinal) {
                Ok(_ctx) => drop(map),
                Err(e) => {
                    log_warn!("mapping kept: {e}");
                    map.leak();
                }
            }
        }
    }

    /// The caller's carrier as a descriptor of its memfd, and its length: the caller holds it
    /// until its resume, so that the bytes outlive this process.
    fn share(&self, pid: u32) -> Result<(OwnedFd, u64), RequestError> {
        let carrier = lock(&self.carriers)
            .get(&pid)
            .cloned()
            .ok_or(RequestError::NoCarrier(pid))?;
        let carrier = lock(&carrier);
        if carrier.is_poisoned() {
            return Err(RequestError::Invalid(format!(
                "the carrier of process {pid} is unusable: a copy into or out of it could not be \
                 confirmed finished"
            )));
        }
        let fd = carrier
            .memfd()
            .ok_or_else(|| RequestError::Invalid(format!("process {pid} has no carrier mapped")))?
            .try_clone_to_owned()
            .map_err(|e| RequestError::Invalid(format!("duplicating the carrier's memfd: {e}")))?;
        Ok((fd, carrier.mapped() as u64))
    }

    fn forget(&self, pid: u32) {
        let carrier = lock(&self.carriers).remove(&pid);
        if let Some(carrier) = carrier
            && let Err(e) = lock(&carrier).free(self.real)
        {
            log_warn!("the carrier of process {pid} stays mapped: {e}");
        }
    }
}

/// One imported allocation waiting for its copy.
struct Item {
    handle: DriverHandle,
    offset: usize,
    size: usize,
    ordinal: i32,
}

/// Whether process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A device UUID as the bytes the shims send ([`Request::CarrierItem`]).
pub fn uuid_bytes(uuid: &cuda_abi::CUuuid) -> [u8; 16] {
    uuid.bytes.map(|b| b as u8)
}
