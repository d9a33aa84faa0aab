//! Devices, contexts (primary and explicit) and streams.
//!
//! Context and stream handles are opaque tagged integers, never dereferenced; a stale or made-up
//! handle is looked up and refused with the driver's code instead of crashing. The current
//! context is per thread, as in CUDA (a single slot: the fake keeps no context stack).
//!
//! Device ordinals the application passes and receives are the process's own: ordinal `n` names
//! machine device `n` until a restore onto other GPUs moves it (a restore whose GPU pairs swap
//! devices 0 and 1 leaves the process's ordinal 0 on the machine's device 1, whose UUID
//! `cuDeviceGetUuid(0)` then returns, as on the real driver). Inside the fake, allocations,
//! contexts, access and accounting use machine devices (the index into `Driver::devices`).

use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint};

use cuda_abi::{CUcontext, CUdevice, CUresult, CUstream, CUuuid, device_attribute as attr};

use crate::state::{self, Driver};
use crate::{Res, memory, write_out};

/// Base of context handle values (`CUcontext` is an opaque pointer to the application).
const CTX_BASE: u64 = 0x00c7_c000_0000;
/// Base of stream handle values.
const STREAM_BASE: u64 = 0x005e_a000_0000;
/// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`: special handles every context accepts.
const STREAM_LEGACY: u64 = 0x1;
const STREAM_PER_THREAD: u64 = 0x2;
/// The last `CUdevice_attribute` of CUDA 13.0 is below this; larger values are invalid.
const ATTRIBUTE_LIMIT: c_int = 160;

/// One fake GPU.
#[derive(Debug)]
pub(crate) struct Device {
    pub uuid: [u8; 16],
    pub total: u64,
}

/// The UUID of device `ordinal`: stable across processes of the same machine, so GPU pairs given
/// to a restore name the same devices everywhere ("FAKE" + ordinal).
pub(crate) fn uuid_of(ordinal: u32) -> [u8; 16] {
    let mut uuid = [
        b'F', b'A', b'K', b'E', 0xcd, 0xa0, 0x40, 0x00, 0x80, 0x00, 0, 0, 0, 0, 0, 0,
    ];
    uuid[12..16].copy_from_slice(&ordinal.to_be_bytes());
    uuid
}

impl Device {
    pub(crate) fn new(ordinal: u32, total: u64) -> Device {
        Device {
            uuid: uuid_of(ordinal),
            total,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Context {
    pub device: usize,
    pub primary: bool,
    /// Primary: retain count (the context is usable while it is above zero). Explicit: 1.
    pub refs: u32,
    /// Contexts this one enabled peer access to (`cuCtxEnablePeerAccess`).
    pub peers: std::collections::BTreeSet<u64>,
    /// `CU_LIMIT_STACK_SIZE`, per thread, in bytes.
    pub stack_size: usize,
}

/// The driver's default `CU_LIMIT_STACK_SIZE` (r580 reports 1024).
pub(crate) const DEFAULT_STACK_SIZE: usize = 1024;

#[derive(Debug)]
struct Stream {
    ctx: u64,
}

#[derive(Debug)]
pub(crate) struct Contexts {
    contexts: BTreeMap<u64, Context>,
    streams: BTreeMap<u64, Stream>,
    next: u64,
    /// The machine device of each of the process's ordinals; moved with the contexts by a
    /// restore onto other GPUs.
    view: Vec<usize>,
}

thread_local! {
    /// The id of this thread's current context (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

fn ctx_handle(id: u64) -> CUcontext {
    (CTX_BASE + id * 0x10) as usize as CUcontext
}

fn ctx_id(ctx: CUcontext) -> Option<u64> {
    let v = ctx as usize as u64;
    (v > CTX_BASE && (v - CTX_BASE).is_multiple_of(0x10)).then(|| (v - CTX_BASE) / 0x10)
}

impl Contexts {
    /// One primary context per device, ids 1..=n, not yet retained.
    pub(crate) fn new(devices: usize) -> Contexts {
        let contexts = (0..devices)
            .map(|device| {
                (
                    device as u64 + 1,
                    Context {
                        device,
                        primary: true,
                        refs: 0,
                        peers: Default::default(),
                        stack_size: DEFAULT_STACK_SIZE,
                    },
                )
            })
            .collect();
        Contexts {
            contexts,
            streams: BTreeMap::new(),
            next: devices as u64 + 1,
            view: (0..devices).collect(),
        }
    }

    /// The machine device the process's ordinal `ordinal` names.
    pub(crate) fn device_of(&self, ordinal: usize) -> Option<usize> {
        self.view.get(ordinal).copied()
    }

    /// The process's ordinal for machine device `device` (the lowest, should a restore have put
    /// two ordinals on one device; `device` itself if none names it).
    pub(crate) fn ordinal_of(&self, device: usize) -> usize {
        self.view
            .iter()
            .position(|&d| d == device)
            .unwrap_or(device)
    }

    /// The machine device of live context `id`.
    pub(crate) fn ctx_device(&self, id: u64) -> Option<usize> {
        self.live(id).map(|c| c.device)
    }

    fn live(&self, id: u64) -> Option<&Context> {
        self.contexts.get(&id).filter(|c| c.refs > 0)
    }

    /// Moves every context, and the process's ordinals, to the machine device `map` gives for
    /// the old one (restore onto other GPUs).
    pub(crate) fn remap(&mut self, map: &[usize]) {
        for ctx in self.contexts.values_mut() {
            if let Some(&to) = map.get(ctx.device) {
                ctx.device = to;
            }
        }
        for device in &mut self.view {
            if let Some(&to) = map.get(*device) {
                *device = to;
            }
        }
    }
}

/// The calling thread's current context: (id, device).
pub(crate) fn current(d: &Driver) -> Res<(u64, usize)> {
    let id = CURRENT.with(Cell::get);
    d.contexts
        .live(id)
        .map(|c| (id, c.device))
        .ok_or(CUresult::ERROR_INVALID_CONTEXT)
}

/// Checks a stream argument of an `Async` call against the current context.
pub(crate) fn check_stream(d: &Driver, stream: CUstream) -> Res {
    resolve_stream(d, stream).map(|_| ())
}

/// The queue key of a stream argument and its context: a created stream's handle, or for the
/// null stream (0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD`: one queue per context in the
/// fake) the current context's id, which is far below every stream handle.
pub(crate) fn resolve_stream(d: &Driver, stream: CUstream) -> Res<(u64, u64)> {
    let (ctx, _) = current(d)?;
    let v = stream as usize as u64;
    if v == 0 || v == STREAM_LEGACY || v == STREAM_PER_THREAD {
        return Ok((ctx, ctx));
    }
    match d.contexts.streams.get(&v) {
        Some(s) if d.contexts.live(s.ctx).is_some() => Ok((v, s.ctx)),
        _ => Err(CUresult::ERROR_INVALID_HANDLE),
    }
}

pub(crate) unsafe fn device_get(device: *mut CUdevice, ordinal: c_int) -> Res {
    if device.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let dev = state::with(|d| d.ordinal(ordinal))?;
    // SAFETY: checked non-null; the caller passes a writable CUdevice.
    unsafe { write_out(device, dev as CUdevice) }
}

pub(crate) unsafe fn device_get_count(count: *mut c_int) -> Res {
    if count.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let n = state::with(|d| Ok(d.devices.len()))?;
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { write_out(count, n as c_int) }
}

pub(crate) unsafe fn device_get_name(name: *mut c_char, len: c_int, dev: CUdevice) -> Res {
    if name.is_null() || len <= 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let ordinal = state::with(|d| d.device(dev))?;
    let text = format!("NVIDIA H200 (fake-cuda {ordinal})");
    let n = text.len().min(len as usize - 1);
    let bytes = text.as_bytes().get(..n).unwrap_or_default();
    // SAFETY: the caller gives `len` writable bytes at `name`; we write n + 1 <= len of them.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), n) };
    // SAFETY: as above, index n < len.
    let end = unsafe { name.add(n) };
    // SAFETY: `end` is inside the caller's buffer (n < len).
    unsafe { end.write(0) };
    Ok(())
}

pub(crate) unsafe fn device_get_uuid(uuid: *mut CUuuid, dev: CUdevice) -> Res {
    if uuid.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let bytes = state::with(|d| {
        let ordinal = d.device(dev)?;
        Ok(d.devices[ordinal].uuid)
    })?;
    let value = CUuuid {
        bytes: bytes.map(|b| b as c_char),
    };
    // SAFETY: checked non-null; the caller passes a writable CUuuid.
    unsafe { write_out(uuid, value) }
}

pub(crate) unsafe fn device_total_mem(bytes: *mut usize, dev: CUdevice) -> Res {
    if bytes.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let total = state::with(|d| {
        let ordinal = d.device(dev)?;
        Ok(d.devices[ordinal].total)
    })?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(bytes, total as usize) }
}

/// The value of attribute `attrib`: an H200-like device, with the VMM, POSIX-fd, FABRIC and
/// MULTICAST support this fake implements (stream-ordered pools are not implemented: 0).
pub(crate) fn attribute(d: &Driver, attrib: c_int, ordinal: usize) -> Res<c_int> {
    if attrib <= 0 || attrib >= ATTRIBUTE_LIMIT {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    Ok(match attrib {
        1 => 1024,
        2 | 3 => 1024,
        4 => 64,
        5 => i32::MAX,
        6 | 7 => 65535,
        8 => 49152,
        9 => 65536,
        10 => 32,
        11 => i32::MAX,
        12 => 65536,
        13 => 1_980_000,
        14 => 512,
        15 => 1,
        attr::MULTIPROCESSOR_COUNT => 132,
        19 => 1,
        31 | 32 => 1,
        attr::PCI_BUS_ID => 0x18 + ordinal as c_int,
        36 => 2_619_000,
        37 => 6144,
        38 => 50 << 20,
        39 => 2048,
        40 => 3,
        41 => 1,
        attr::COMPUTE_CAPABILITY_MAJOR => 9,
        83 | 89 => 1,
        attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
        // The H200 (r580) supports GPUDirect RDMA on VMM memory.
        attr::GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED => 1,
        attr::HANDLE_TYPE_FABRIC_SUPPORTED => c_int::from(d.config.fabric),
        attr::MULTICAST_SUPPORTED => c_int::from(d.config.multicast),
        _ => 0,
    })
}

pub(crate) unsafe fn device_get_attribute(value: *mut c_int, attrib: c_int, dev: CUdevice) -> Res {
    if value.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let v = state::with(|d| {
        let ordinal = d.device(dev)?;
        attribute(d, attrib, ordinal)
    })?;
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { write_out(value, v) }
}

pub(crate) unsafe fn primary_ctx_retain(ctx: *mut CUcontext, dev: CUdevice) -> Res {
    if ctx.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = state::with(|d| {
        // Primary context n + 1 belongs to the process's ordinal n (restore moves both together).
        let ordinal = d.ordinal(dev)?;
        let id = ordinal as u64 + 1;
        if let Some(c) = d.contexts.contexts.get_mut(&id) {
            c.refs = c.refs.saturating_add(1);
        }
        Ok(id)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUcontext.
    unsafe { write_out(ctx, ctx_handle(id)) }
}

/// Frees what a context owned when it goes away: its streams (their queued work discarded,
/// their workers ended), events, modules and `cuMemAlloc` memory.
fn teardown(d: &mut Driver, id: u64) {
    d.contexts.streams.retain(|_, s| s.ctx != id);
    crate::exec::drop_context(d, id);
    // Peer access from and to it ends with it.
    for c in d.contexts.contexts.values_mut() {
        c.peers.remove(&id);
    }
    if let Some(c) = d.contexts.contexts.get_mut(&id) {
        c.peers.clear();
    }
    memory::legacy::free_context(d, id);
}

pub(crate) fn primary_ctx_release(dev: CUdevice) -> Res {
    state::with(|d| {
        let ordinal = d.ordinal(dev)?;
        let id = ordinal as u64 + 1;
        let ctx = d
            .contexts
            .contexts
            .get_mut(&id)
            .filter(|c| c.refs > 0)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        ctx.refs -= 1;
        if ctx.refs == 0 {
            teardown(d, id);
        }
        Ok(())
    })
}

/// `cuDevicePrimaryCtxReset_v2`: the primary context's memory, streams and peer access go, as
/// at its last release; its retains stay counted (the driver keeps the context retained and
/// makes it anew when it is next used, which the fake's contexts need not model).
pub(crate) fn primary_ctx_reset(dev: CUdevice) -> Res {
    state::with(|d| {
        let ordinal = d.ordinal(dev)?;
        let id = ordinal as u64 + 1;
        if d.contexts.contexts.contains_key(&id) {
            teardown(d, id);
        }
        Ok(())
    })
}

/// `cuCtxCreate_v2`: a new explicit context on `dev`, made current for the calling thread.
pub(crate) unsafe fn ctx_create(ctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> Res {
    if ctx.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // CU_CTX_SCHED_* (0x07), MAP_HOST (0x08), LMEM_RESIZE_TO_MAX (0x10), COREDUMP/USER_COREDUMP
    // (0x20, 0x40), SYNC_MEMOPS (0x80): accepted and ignored, the fake has no scheduling.
    if flags & !0xff != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = state::with(|d| {
        let device = d.device(dev)?;
        let id = d.contexts.next;
        d.contexts.next += 1;
        d.contexts.contexts.insert(
            id,
            Context {
                device,
                primary: false,
                refs: 1,
                peers: Default::default(),
                stack_size: DEFAULT_STACK_SIZE,
            },
        );
        Ok(id)
    })?;
    CURRENT.with(|c| c.set(id));
    // SAFETY: checked non-null; the caller passes a writable CUcontext.
    unsafe { write_out(ctx, ctx_handle(id)) }
}

/// `cuCtxCreate_v3`/`_v4` take execution-affinity (and CIG) parameters the fake does not model:
/// only "none" is accepted.
pub(crate) unsafe fn ctx_create_with_params(
    ctx: *mut CUcontext,
    params_given: bool,
    flags: c_uint,
    dev: CUdevice,
) -> Res {
    if params_given {
        return Err(CUresult::ERROR_NOT_SUPPORTED);
    }
    // SAFETY: forwarded unchanged from the caller.
    unsafe { ctx_create(ctx, flags, dev) }
}

pub(crate) fn ctx_destroy(ctx: CUcontext) -> Res {
    let id = ctx_id(ctx).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    state::with(|d| {
        match d.contexts.contexts.get(&id) {
            Some(c) if !c.primary => {}
            _ => return Err(CUresult::ERROR_INVALID_CONTEXT),
        }
        d.contexts.contexts.remove(&id);
        teardown(d, id);
        Ok(())
    })?;
    if CURRENT.with(Cell::get) == id {
        CURRENT.with(|c| c.set(0));
    }
    Ok(())
}

/// `cuCtxEnablePeerAccess` from the current context to `peer`'s. r580's codes: flags other than 0
/// `INVALID_VALUE`; no current context, or a peer that is no live context, `INVALID_CONTEXT`; a
/// peer on the current context's own device (which `cuDeviceCanAccessPeer` says it cannot
/// access as a peer) `INVALID_DEVICE`; enabled already `PEER_ACCESS_ALREADY_ENABLED`. The fake
/// keeps the state only: its memory is reachable from every device either way.
pub(crate) fn ctx_enable_peer_access(peer: CUcontext, flags: c_uint) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = CURRENT.with(Cell::get);
    let peer = ctx_id(peer).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    state::with(|d| {
        let own = d.contexts.live(id).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        let other = d
            .contexts
            .live(peer)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if own.device == other.device {
            return Err(CUresult::ERROR_INVALID_DEVICE);
        }
        let c = d
            .contexts
            .contexts
            .get_mut(&id)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if !c.peers.insert(peer) {
            return Err(CUresult::ERROR_PEER_ACCESS_ALREADY_ENABLED);
        }
        Ok(())
    })
}

/// `cuCtxDisablePeerAccess`: `PEER_ACCESS_NOT_ENABLED` unless the current context enabled access
/// to `peer`; `INVALID_CONTEXT` without a current context or for a peer that is no context.
pub(crate) fn ctx_disable_peer_access(peer: CUcontext) -> Res {
    let id = CURRENT.with(Cell::get);
    let peer = ctx_id(peer).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    state::with(|d| {
        d.contexts
            .live(peer)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        let c = d
            .contexts
            .contexts
            .get_mut(&id)
            .filter(|c| c.refs > 0)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
        if !c.peers.remove(&peer) {
            return Err(CUresult::ERROR_PEER_ACCESS_NOT_ENABLED);
        }
        Ok(())
    })
}

pub(crate) fn ctx_set_current(ctx: CUcontext) -> Res {
    if ctx.is_null() {
        CURRENT.with(|c| c.set(0));
        return Ok(());
    }
    let id = ctx_id(ctx).ok_or(CUresult::ERROR_INVALID_CONTEXT)?;
    state::with(|d| {
        d.contexts
            .live(id)
            .map(|_| ())
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)
    })?;
    CURRENT.with(|c| c.set(id));
    Ok(())
}

pub(crate) unsafe fn ctx_get_current(ctx: *mut CUcontext) -> Res {
    if ctx.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = CURRENT.with(Cell::get);
    let live = state::with(|d| Ok(d.contexts.live(id).is_some()))?;
    let value = if live {
        ctx_handle(id)
    } else {
        std::ptr::null_mut()
    };
    // SAFETY: checked non-null; the caller passes a writable CUcontext.
    unsafe { write_out(ctx, value) }
}

pub(crate) unsafe fn ctx_get_device(dev: *mut CUdevice) -> Res {
    if dev.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let ordinal = state::with(|d| current(d).map(|(_, device)| d.ordinal_of(device)))?;
    // SAFETY: checked non-null; the caller passes a writable CUdevice.
    unsafe { write_out(dev, ordinal as CUdevice) }
}

/// `cuDevicePrimaryCtxGetState`: the flags (always 0: `cuDevicePrimaryCtxSetFlags` is not
/// modelled) and whether the primary context is active (retained).
pub(crate) unsafe fn primary_ctx_get_state(
    dev: CUdevice,
    flags: *mut c_uint,
    active: *mut c_int,
) -> Res {
    if flags.is_null() || active.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let is_active = state::with(|d| {
        let ordinal = d.ordinal(dev)?;
        Ok(d.contexts.live(ordinal as u64 + 1).is_some())
    })?;
    // SAFETY: checked non-null; the caller passes a writable unsigned int.
    unsafe { write_out(flags, 0) }?;
    // SAFETY: checked non-null; the caller passes a writable int.
    unsafe { write_out(active, c_int::from(is_active)) }
}

/// `cuCtxGetLimit`; of the limits, only the stack size is modelled (others: unsupported).
pub(crate) unsafe fn ctx_get_limit(value: *mut usize, limit: c_int) -> Res {
    if value.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    if limit != cuda_abi::limit::STACK_SIZE {
        return Err(CUresult::ERROR_UNSUPPORTED_LIMIT);
    }
    let size = state::with(|d| {
        let (id, _) = current(d)?;
        d.contexts
            .live(id)
            .map(|c| c.stack_size)
            .ok_or(CUresult::ERROR_INVALID_CONTEXT)
    })?;
    // SAFETY: checked non-null; the caller passes a writable size_t.
    unsafe { write_out(value, size) }
}

/// `cuCtxSetLimit` of the stack size (any value, 0 included, as r580 takes it).
pub(crate) fn ctx_set_limit(limit: c_int, value: usize) -> Res {
    if limit != cuda_abi::limit::STACK_SIZE {
        return Err(CUresult::ERROR_UNSUPPORTED_LIMIT);
    }
    state::with(|d| {
        let (id, _) = current(d)?;
        match d.contexts.contexts.get_mut(&id) {
            Some(c) if c.refs > 0 => {
                c.stack_size = value;
                Ok(())
            }
            _ => Err(CUresult::ERROR_INVALID_CONTEXT),
        }
    })
}

pub(crate) unsafe fn stream_create(stream: *mut CUstream, flags: c_uint) -> Res {
    if stream.is_null() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    // CU_STREAM_DEFAULT (0) and CU_STREAM_NON_BLOCKING (1).
    if flags > 1 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let handle = state::with(|d| {
        let (ctx, _) = current(d)?;
        let handle = STREAM_BASE + d.next_id() * 0x10;
        d.contexts.streams.insert(handle, Stream { ctx });
        Ok(handle)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUstream.
    unsafe { write_out(stream, handle as usize as CUstream) }
}

/// `cuStreamDestroy_v2`: the handle is invalid at once; work already queued still runs, then
/// the stream's worker ends (as on the driver, which completes it before freeing the stream).
pub(crate) fn stream_destroy(stream: CUstream) -> Res {
    let key = stream as usize as u64;
    state::with(|d| {
        d.contexts
            .streams
            .remove(&key)
            .ok_or(CUresult::ERROR_INVALID_HANDLE)?;
        crate::exec::close_stream(d, key);
        Ok(())
    })
}

/// The device ordinal that has UUID `uuid`.
pub(crate) fn device_by_uuid(d: &Driver, uuid: &[u8; 16]) -> Option<usize> {
    d.devices.iter().position(|dev| &dev.uuid == uuid)
}
