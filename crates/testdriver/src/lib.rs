//! A tiny in-process driver made of Rust functions, for unit tests of the runtime without any
//! libcuda: allocations are byte vectors, exported descriptors are memfds naming the allocation,
//! copies go through the recorded VA mappings. Shared by all tests of the process (like one
//! machine), so tests only assert on what they made.
//!
//! A crate of its own so that the copy engine (`cuinterpose-copy`) and the runtime
//! (`cuinterpose-shim-runtime`) test on the same driver; only their tests depend on it.

// Test code, and a driver: it implements the C entry points, so it is `unsafe extern "C"`
// functions reading and writing its callers' pointers, as every driver does.
#![allow(
    unsafe_code,
    clippy::missing_safety_doc,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use cuda::DriverTable as Real;
use cuda_abi::*;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd};
use std::sync::{Mutex, MutexGuard};

/// `cuMemCreate` of exactly this size fails with OUT_OF_MEMORY (fault injection).
pub const FAIL_SIZE: usize = 0x1234_0000;
pub const HOST_MAGIC: &[u8; 8] = b"FAKEALOC";
/// `cuMemCreate` of exactly this size blocks inside the driver until [`unblock`] (an in-flight
/// tracked call for Freeze to wait for).
pub const BLOCK_SIZE: usize = 0x4321_0000;

/// 0 idle, 1 a call is blocked inside, 2 let it go.
static BLOCKED: (Mutex<u8>, std::sync::Condvar) = (Mutex::new(0), std::sync::Condvar::new());

/// A `cuMemHostRegister` that refuses every range (a driver that cannot pin host memory), for
/// tests that put it in their table.
pub unsafe extern "C" fn refuse_register(
    _: *mut core::ffi::c_void,
    _: usize,
    _: core::ffi::c_uint,
) -> CUresult {
    CUresult::ERROR_NOT_SUPPORTED
}

/// Waits until a `BLOCK_SIZE` create is inside the driver.
pub fn wait_blocked() {
    let mut s = BLOCKED.0.lock().unwrap();
    while *s != 1 {
        s = BLOCKED.1.wait(s).unwrap();
    }
}

/// Lets the blocked create return.
pub fn unblock() {
    *BLOCKED.0.lock().unwrap() = 2;
    BLOCKED.1.notify_all();
}

#[derive(Debug)]
pub struct Alloc {
    pub data: Vec<u8>,
    pub handles: u32,
    pub maps: u32,
    pub prop: (u32, u32, u32, i32),
    /// `allocFlags.gpuDirectRDMACapable` of the creation.
    pub rdma: u8,
}

#[derive(Debug)]
pub struct Fake {
    next: u64,
    pub allocs: BTreeMap<u64, Alloc>,
    pub handles: BTreeMap<u64, u64>,
    pub maps: BTreeMap<u64, (u64, u64, u64)>,
    reserved: BTreeMap<u64, u64>,
    next_va: u64,
    host: BTreeMap<usize, usize>,
}

static FAKE: Mutex<Fake> = Mutex::new(Fake {
    next: 0x5000,
    allocs: BTreeMap::new(),
    handles: BTreeMap::new(),
    maps: BTreeMap::new(),
    reserved: BTreeMap::new(),
    next_va: 0x7f00_0000_0000,
    host: BTreeMap::new(),
});

pub fn fake() -> MutexGuard<'static, Fake> {
    FAKE.lock().unwrap_or_else(|e| e.into_inner())
}

impl Fake {
    fn id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// A new handle to the existing allocation `aid` (retained or imported), counted on it.
    fn another_handle(&mut self, aid: u64) -> u64 {
        let handle = self.id();
        self.handles.insert(handle, aid);
        if let Some(a) = self.allocs.get_mut(&aid) {
            a.handles += 1;
        }
        handle
    }

    fn reap(&mut self, aid: u64) {
        if self
            .allocs
            .get(&aid)
            .is_some_and(|a| a.handles == 0 && a.maps == 0)
        {
            self.allocs.remove(&aid);
        }
    }

    /// The allocation a driver handle names.
    pub fn alloc_of(&self, handle: u64) -> Option<u64> {
        self.handles.get(&handle).copied()
    }

    /// Resolves a device address to (allocation, offset in it, bytes left in the mapping).
    fn resolve(&self, addr: u64) -> Option<(u64, usize, usize)> {
        let (&va, &(size, aid, off)) = self.maps.range(..=addr).next_back()?;
        if addr >= va + size {
            return None;
        }
        Some((aid, (off + addr - va) as usize, (va + size - addr) as usize))
    }

    /// Whether any mapping starts or lies inside `[addr, addr + size)`.
    pub fn mapped_in(&self, addr: u64, size: usize) -> bool {
        self.maps.range(addr..addr + size as u64).next().is_some() || self.resolve(addr).is_some()
    }

    pub fn read(&self, addr: u64, n: usize) -> Option<Vec<u8>> {
        let (aid, off, left) = self.resolve(addr)?;
        if n > left {
            return None;
        }
        self.allocs
            .get(&aid)?
            .data
            .get(off..off + n)
            .map(<[u8]>::to_vec)
    }

    pub fn write(&mut self, addr: u64, bytes: &[u8]) -> Option<()> {
        let (aid, off, left) = self.resolve(addr)?;
        if bytes.len() > left {
            return None;
        }
        self.allocs
            .get_mut(&aid)?
            .data
            .get_mut(off..off + bytes.len())?
            .copy_from_slice(bytes);
        Some(())
    }
}

const OK: CUresult = CUresult::SUCCESS;
const INVAL: CUresult = CUresult::ERROR_INVALID_VALUE;

unsafe extern "C" fn init(_: c_uint) -> CUresult {
    OK
}
unsafe extern "C" fn mem_create(
    h: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    _: c_ulonglong,
) -> CUresult {
    if h.is_null() || prop.is_null() || size == 0 {
        return INVAL;
    }
    if size == FAIL_SIZE {
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    if size == BLOCK_SIZE {
        let mut s = BLOCKED.0.lock().unwrap();
        *s = 1;
        BLOCKED.1.notify_all();
        while *s != 2 {
            s = BLOCKED.1.wait(s).unwrap();
        }
        *s = 0;
    }
    let p = unsafe { *prop };
    if p.requestedHandleTypes & handle_type::FABRIC != 0 {
        return CUresult::ERROR_NOT_PERMITTED;
    }
    let mut f = fake();
    let aid = f.id();
    let handle = f.id();
    f.allocs.insert(
        aid,
        Alloc {
            data: vec![0; size],
            handles: 1,
            maps: 0,
            prop: (
                p.type_,
                p.requestedHandleTypes,
                p.location.type_,
                p.location.id,
            ),
            rdma: p.allocFlags.gpuDirectRDMACapable,
        },
    );
    f.handles.insert(handle, aid);
    unsafe { h.write(handle) };
    OK
}
unsafe extern "C" fn mem_release(h: u64) -> CUresult {
    let mut f = fake();
    let Some(aid) = f.handles.remove(&h) else {
        return INVAL;
    };
    if let Some(a) = f.allocs.get_mut(&aid) {
        a.handles -= 1;
    }
    f.reap(aid);
    OK
}
unsafe extern "C" fn reserve(
    p: *mut u64,
    size: usize,
    _: usize,
    _: u64,
    _: c_ulonglong,
) -> CUresult {
    if p.is_null() {
        return INVAL;
    }
    let mut f = fake();
    let va = f.next_va;
    f.next_va += (size as u64).next_multiple_of(1 << 21) + (1 << 21);
    f.reserved.insert(va, size as u64);
    unsafe { p.write(va) };
    OK
}
unsafe extern "C" fn address_free(p: u64, _: usize) -> CUresult {
    if fake().reserved.remove(&p).is_some() {
        OK
    } else {
        INVAL
    }
}
unsafe extern "C" fn map(p: u64, size: usize, offset: usize, h: u64, _: c_ulonglong) -> CUresult {
    let mut f = fake();
    let Some(aid) = f.alloc_of(h) else {
        return INVAL;
    };
    if f.allocs
        .get(&aid)
        .is_none_or(|a| offset + size > a.data.len())
    {
        return INVAL;
    }
    if f.mapped_in(p, size) {
        return CUresult::ERROR_ALREADY_MAPPED;
    }
    f.maps.insert(p, (size as u64, aid, offset as u64));
    if let Some(a) = f.allocs.get_mut(&aid) {
        a.maps += 1;
    }
    OK
}
unsafe extern "C" fn unmap(p: u64, size: usize) -> CUresult {
    let mut f = fake();
    let end = p + size as u64;
    let inside: Vec<u64> = f.maps.range(p..end).map(|(&a, _)| a).collect();
    if inside.is_empty() {
        return CUresult::ERROR_NOT_MAPPED;
    }
    for va in inside {
        if let Some((_, aid, _)) = f.maps.remove(&va) {
            if let Some(a) = f.allocs.get_mut(&aid) {
                a.maps -= 1;
            }
            f.reap(aid);
        }
    }
    OK
}
unsafe extern "C" fn set_access(p: u64, _: usize, d: *const CUmemAccessDesc, n: usize) -> CUresult {
    if d.is_null() || n == 0 || fake().resolve(p).is_none() {
        return INVAL;
    }
    OK
}
unsafe extern "C" fn retain(h: *mut u64, addr: *mut c_void) -> CUresult {
    let mut f = fake();
    let Some((aid, _, _)) = f.resolve(addr as u64) else {
        return INVAL;
    };
    let handle = f.another_handle(aid);
    unsafe { h.write(handle) };
    OK
}
unsafe extern "C" fn get_props(p: *mut CUmemAllocationProp, h: u64) -> CUresult {
    let f = fake();
    let Some(a) = f.alloc_of(h).and_then(|aid| f.allocs.get(&aid)) else {
        return INVAL;
    };
    let mut out = CUmemAllocationProp {
        type_: a.prop.0,
        requestedHandleTypes: a.prop.1,
        ..CUmemAllocationProp::default()
    };
    out.location.type_ = a.prop.2;
    out.location.id = a.prop.3;
    unsafe { p.write(out) };
    OK
}
unsafe extern "C" fn export(s: *mut c_void, h: u64, ty: u32, _: c_ulonglong) -> CUresult {
    let f = fake();
    let Some(aid) = f.alloc_of(h) else {
        return INVAL;
    };
    if ty != handle_type::POSIX_FILE_DESCRIPTOR {
        return CUresult::ERROR_NOT_SUPPORTED;
    }
    if f.allocs.get(&aid).is_none_or(|a| a.prop.1 & ty == 0) {
        return INVAL;
    }
    drop(f);
    let fd = rustix::fs::memfd_create("fake-export", rustix::fs::MemfdFlags::empty()).unwrap();
    let mut bytes = HOST_MAGIC.to_vec();
    bytes.extend_from_slice(&aid.to_le_bytes());
    rustix::io::pwrite(&fd, &bytes, 0).unwrap();
    unsafe { s.cast::<c_int>().write(fd.into_raw_fd()) };
    OK
}
unsafe extern "C" fn import(h: *mut u64, os: *mut c_void, ty: u32) -> CUresult {
    if ty != handle_type::POSIX_FILE_DESCRIPTOR {
        return CUresult::ERROR_NOT_SUPPORTED;
    }
    let fd = unsafe { BorrowedFd::borrow_raw(os as usize as i32) };
    let mut buf = [0u8; 16];
    if rustix::io::pread(fd.as_fd(), &mut buf, 0) != Ok(16) || &buf[..8] != HOST_MAGIC {
        return INVAL;
    }
    let aid = u64::from_le_bytes(buf[8..16].try_into().unwrap());
    let mut f = fake();
    if !f.allocs.contains_key(&aid) {
        return INVAL;
    }
    let handle = f.another_handle(aid);
    unsafe { h.write(handle) };
    OK
}
unsafe extern "C" fn ok_ptr(_: CUdeviceptr) -> CUresult {
    OK
}
unsafe extern "C" fn ipc_get(_: *mut CUipcMemHandle, _: CUdeviceptr) -> CUresult {
    OK
}
unsafe extern "C" fn ipc_open(p: *mut CUdeviceptr, _: CUipcMemHandle, _: c_uint) -> CUresult {
    unsafe { p.write(0xdead_0000) };
    OK
}
unsafe extern "C" fn mc_create(h: *mut u64, prop: *const CUmulticastObjectProp) -> CUresult {
    // SAFETY: the caller's property struct.
    let prop = unsafe { *prop };
    let mut f = fake();
    let aid = f.id();
    let handle = f.id();
    f.allocs.insert(
        aid,
        Alloc {
            data: vec![0; prop.size],
            handles: 1,
            maps: 0,
            // Exportable as the handle types asked for; no location.
            prop: (0, prop.handleTypes as u32, 0, 0),
            rdma: 0,
        },
    );
    f.handles.insert(handle, aid);
    unsafe { h.write(handle) };
    OK
}
unsafe extern "C" fn mc_add(_: u64, _: CUdevice) -> CUresult {
    OK
}
unsafe extern "C" fn mc_bind_mem(
    _: u64,
    _: usize,
    _: u64,
    _: usize,
    _: usize,
    _: c_ulonglong,
) -> CUresult {
    OK
}
unsafe extern "C" fn mc_bind_mem2(
    _: u64,
    _: CUdevice,
    _: usize,
    _: u64,
    _: usize,
    _: usize,
    _: c_ulonglong,
) -> CUresult {
    OK
}
unsafe extern "C" fn mc_bind_addr(
    _: u64,
    _: usize,
    _: CUdeviceptr,
    _: usize,
    _: c_ulonglong,
) -> CUresult {
    OK
}
unsafe extern "C" fn mc_bind_addr2(
    _: u64,
    _: CUdevice,
    _: usize,
    _: CUdeviceptr,
    _: usize,
    _: c_ulonglong,
) -> CUresult {
    OK
}
unsafe extern "C" fn mc_unbind(_: u64, _: CUdevice, _: usize, _: usize) -> CUresult {
    OK
}
unsafe extern "C" fn driver_version(v: *mut c_int) -> CUresult {
    unsafe { v.write(13000) };
    OK
}
unsafe extern "C" fn device_get(d: *mut CUdevice, o: c_int) -> CUresult {
    unsafe { d.write(o) };
    OK
}
unsafe extern "C" fn device_count(c: *mut c_int) -> CUresult {
    unsafe { c.write(2) };
    OK
}
unsafe extern "C" fn device_uuid(_: *mut CUuuid, _: CUdevice) -> CUresult {
    OK
}
unsafe extern "C" fn primary_retain(c: *mut CUcontext, _: CUdevice) -> CUresult {
    unsafe { c.write(8 as CUcontext) };
    OK
}
unsafe extern "C" fn primary_release(_: CUdevice) -> CUresult {
    OK
}
unsafe extern "C" fn ctx_get(c: *mut CUcontext) -> CUresult {
    unsafe { c.write(std::ptr::null_mut()) };
    OK
}
unsafe extern "C" fn ctx_set(_: CUcontext) -> CUresult {
    OK
}
/// Device 0 supports RDMA on VMM memory (as the H200 does); other attributes are 0.
unsafe extern "C" fn device_attribute(v: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    let rdma = attrib == device_attribute::GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED && dev == 0;
    unsafe { v.write(c_int::from(rdma)) };
    OK
}
unsafe extern "C" fn ctx_device(d: *mut CUdevice) -> CUresult {
    unsafe { d.write(0) };
    OK
}
unsafe extern "C" fn ctx_sync() -> CUresult {
    OK
}
/// The stack size limit: the driver's default, whatever was set (a test that follows the limit
/// gives its runtime entries of its own).
unsafe extern "C" fn ctx_get_limit(value: *mut usize, _limit: c_int) -> CUresult {
    unsafe { *value = 1024 };
    OK
}
unsafe extern "C" fn ctx_set_limit(_limit: c_int, _value: usize) -> CUresult {
    OK
}
unsafe extern "C" fn dtoh(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    let Some(bytes) = fake().read(src, n) else {
        return CUresult::ERROR_ILLEGAL_ADDRESS;
    };
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast::<u8>(), n) };
    OK
}
unsafe extern "C" fn htod(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    let bytes = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) };
    match fake().write(dst, bytes) {
        Some(()) => OK,
        None => CUresult::ERROR_ILLEGAL_ADDRESS,
    }
}
unsafe extern "C" fn memset_d8(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    match fake().write(dst, &vec![value; n]) {
        Some(()) => OK,
        None => CUresult::ERROR_ILLEGAL_ADDRESS,
    }
}
unsafe extern "C" fn dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    _: CUstream,
) -> CUresult {
    unsafe { dtoh(dst, src, n) }
}
unsafe extern "C" fn htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    _: CUstream,
) -> CUresult {
    unsafe { htod(dst, src, n) }
}
unsafe extern "C" fn stream_create(s: *mut CUstream, _: c_uint) -> CUresult {
    unsafe { s.write(16 as CUstream) };
    OK
}
unsafe extern "C" fn stream_sync(_: CUstream) -> CUresult {
    OK
}
unsafe extern "C" fn stream_destroy(_: CUstream) -> CUresult {
    OK
}
unsafe extern "C" fn host_alloc(p: *mut *mut c_void, n: usize, _: c_uint) -> CUresult {
    let buf = vec![0u8; n].into_boxed_slice();
    let ptr = Box::into_raw(buf).cast::<u8>() as usize;
    fake().host.insert(ptr, n);
    unsafe { p.write(ptr as *mut c_void) };
    OK
}
unsafe extern "C" fn free_host(p: *mut c_void) -> CUresult {
    let Some(n) = fake().host.remove(&(p as usize)) else {
        return INVAL;
    };
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p.cast::<u8>(), n)) });
    OK
}
unsafe extern "C" fn host_register(_: *mut c_void, _: usize, _: c_uint) -> CUresult {
    OK
}
unsafe extern "C" fn host_unregister(_: *mut c_void) -> CUresult {
    OK
}
unsafe extern "C" fn granularity(g: *mut usize, _: *const CUmemAllocationProp, _: u32) -> CUresult {
    unsafe { g.write(1 << 21) };
    OK
}
unsafe extern "C" fn mc_granularity(
    g: *mut usize,
    _: *const CUmulticastObjectProp,
    _: u32,
) -> CUresult {
    unsafe { g.write(1 << 21) };
    OK
}
unsafe extern "C" fn mem_info(free: *mut usize, total: *mut usize) -> CUresult {
    unsafe { free.write(1 << 33) };
    unsafe { total.write(1 << 33) };
    OK
}
unsafe extern "C" fn get_access(
    f: *mut c_ulonglong,
    _: *const CUmemLocation,
    _: CUdeviceptr,
) -> CUresult {
    unsafe { f.write(3) };
    OK
}

/// The driver table.
pub fn real() -> Real {
    Real {
        cuInit: init,
        cuMemCreate: mem_create,
        cuMemRelease: mem_release,
        cuMemAddressReserve: reserve,
        cuMemAddressFree: address_free,
        cuMemMap: map,
        cuMemUnmap: unmap,
        cuMemSetAccess: set_access,
        cuMemRetainAllocationHandle: retain,
        cuMemGetAllocationPropertiesFromHandle: get_props,
        cuMemExportToShareableHandle: export,
        cuMemImportFromShareableHandle: import,
        cuMemFree_v2: ok_ptr,
        cuIpcGetMemHandle: ipc_get,
        cuIpcOpenMemHandle_v2: ipc_open,
        cuIpcCloseMemHandle: ok_ptr,
        cuMulticastCreate: mc_create,
        cuMulticastAddDevice: mc_add,
        cuMulticastBindMem: mc_bind_mem,
        cuMulticastBindMem_v2: mc_bind_mem2,
        cuMulticastBindAddr: mc_bind_addr,
        cuMulticastBindAddr_v2: mc_bind_addr2,
        cuMulticastUnbind: mc_unbind,
        cuDriverGetVersion: driver_version,
        cuDeviceGet: device_get,
        cuDeviceGetCount: device_count,
        cuDeviceGetUuid: device_uuid,
        cuDevicePrimaryCtxRetain: primary_retain,
        cuDevicePrimaryCtxRelease_v2: primary_release,
        // A reset, like a release, has nothing to do in the test driver's one context.
        cuDevicePrimaryCtxReset_v2: primary_release,
        cuCtxGetCurrent: ctx_get,
        cuCtxSetCurrent: ctx_set,
        cuCtxSynchronize: ctx_sync,
        cuCtxGetLimit: ctx_get_limit,
        cuCtxSetLimit: ctx_set_limit,
        cuCtxGetDevice: ctx_device,
        cuDeviceGetAttribute: device_attribute,
        cuMemcpyDtoH_v2: dtoh,
        cuMemcpyHtoD_v2: htod,
        cuMemsetD8_v2: memset_d8,
        cuMemcpyDtoHAsync_v2: dtoh_async,
        cuMemcpyHtoDAsync_v2: htod_async,
        cuStreamCreate: stream_create,
        cuStreamSynchronize: stream_sync,
        cuStreamDestroy_v2: stream_destroy,
        cuMemHostAlloc: host_alloc,
        cuMemFreeHost: free_host,
        cuMemHostRegister_v2: host_register,
        cuMemHostUnregister: host_unregister,
        cuMemGetAllocationGranularity: granularity,
        cuMulticastGetGranularity: mc_granularity,
        cuMemGetInfo_v2: mem_info,
        cuMemGetAccess: get_access,
        // Entries only the tool and the workloads call.
        ..Real::unresolved()
    }
}

/// A scripted failure: the number of calls to let through before one call fails (then it is off
/// again); `u32::MAX` is off. Each scripted entry has its own, so a test arms only the runtime
/// whose table holds that entry.
#[derive(Debug)]
pub struct Script(std::sync::atomic::AtomicU32);

impl Script {
    const OFF: u32 = u32::MAX;

    pub const fn off() -> Script {
        Script(std::sync::atomic::AtomicU32::new(Script::OFF))
    }

    /// The call after `pass` more calls fails.
    pub fn fail_after(&self, pass: u32) {
        self.0.store(pass, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether this call fails (and counts it).
    fn fails(&self) -> bool {
        use std::sync::atomic::Ordering;
        let left = self.0.load(Ordering::SeqCst);
        match left {
            Script::OFF => false,
            0 => {
                self.0.store(Script::OFF, Ordering::SeqCst);
                true
            }
            n => {
                self.0.store(n - 1, Ordering::SeqCst);
                false
            }
        }
    }
}

/// Every asynchronous device-to-host copy fails (a Save whose copy breaks).
pub unsafe extern "C" fn dtoh_async_fails(
    _: *mut c_void,
    _: CUdeviceptr,
    _: usize,
    _: CUstream,
) -> CUresult {
    CUresult::ERROR_ILLEGAL_ADDRESS
}

/// The range the last [`set_access_fails`] call refused, so that a test can check that nothing is
/// left mapped there (the mapping table is shared by every test of the process, so counting it
/// races with them).
pub static REFUSED_ACCESS: Mutex<Option<(u64, usize)>> = Mutex::new(None);

/// `cuMemSetAccess` that always fails (an owned cuMemAlloc undone at its last step).
pub unsafe extern "C" fn set_access_fails(
    ptr: u64,
    size: usize,
    _: *const CUmemAccessDesc,
    _: usize,
) -> CUresult {
    *REFUSED_ACCESS.lock().unwrap_or_else(|e| e.into_inner()) = Some((ptr, size));
    CUresult::ERROR_INVALID_DEVICE
}

/// The script of [`release_scripted`].
pub static RELEASE: Script = Script::off();

/// `cuMemRelease` that fails when [`RELEASE`] says so.
pub unsafe extern "C" fn release_scripted(h: u64) -> CUresult {
    if RELEASE.fails() {
        return CUresult::ERROR_UNKNOWN;
    }
    unsafe { mem_release(h) }
}

/// The script of [`create_scripted`].
pub static CREATE: Script = Script::off();

/// `cuMemCreate` that fails when [`CREATE`] says so.
pub unsafe extern "C" fn create_scripted(
    h: *mut u64,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
) -> CUresult {
    if CREATE.fails() {
        return CUresult::ERROR_OUT_OF_MEMORY;
    }
    let r = unsafe { mem_create(h, size, prop, flags) };
    if r == OK {
        CREATED.lock().unwrap().push(unsafe { h.read() });
    }
    r
}

/// The driver handles [`create_scripted`] made, in order.
pub static CREATED: Mutex<Vec<u64>> = Mutex::new(Vec::new());

/// `cuCtxGetDevice` answering device 1 (an IPC opener on another device than the creator's).
pub unsafe extern "C" fn ctx_device_1(d: *mut CUdevice) -> CUresult {
    unsafe { d.write(1) };
    OK
}

/// `cuCtxGetCurrent` answering the primary context [`real`]'s retain hands out (8).
pub unsafe extern "C" fn ctx_get_primary(c: *mut CUcontext) -> CUresult {
    unsafe { c.write(8 as CUcontext) };
    OK
}

/// `cuCtxDestroy` that succeeds.
pub unsafe extern "C" fn ctx_destroy_ok(_: CUcontext) -> CUresult {
    OK
}

/// `cuDevicePrimaryCtxRetain` handing out `8 + device`: one primary context per device.
pub unsafe extern "C" fn primary_retain_per_device(c: *mut CUcontext, dev: CUdevice) -> CUresult {
    unsafe { c.write((8 + dev as usize) as CUcontext) };
    OK
}

/// `cuCtxEnablePeerAccess` that succeeds.
pub unsafe extern "C" fn peer_enable_ok(_: CUcontext, _: c_uint) -> CUresult {
    OK
}

/// `cuCtxDisablePeerAccess` that succeeds.
pub unsafe extern "C" fn peer_disable_ok(_: CUcontext) -> CUresult {
    OK
}

/// The stack size of the test driver's context in `tests::the_context_stack_is_given_back_from_release_to_thaw`
/// (it starts as an application's grown stack), and every value set, in order.
pub static STACK: std::sync::Mutex<(usize, Vec<usize>)> = std::sync::Mutex::new((4096, Vec::new()));

pub unsafe extern "C" fn stack_get(value: *mut usize, limit: core::ffi::c_int) -> CUresult {
    if limit != cuda_abi::limit::STACK_SIZE {
        return CUresult::ERROR_UNSUPPORTED_LIMIT;
    }
    let size = STACK.lock().unwrap_or_else(|e| e.into_inner()).0;
    // SAFETY: the runtime passes a valid out-pointer.
    unsafe { *value = size };
    CUresult::SUCCESS
}

pub unsafe extern "C" fn stack_set(limit: core::ffi::c_int, value: usize) -> CUresult {
    if limit != cuda_abi::limit::STACK_SIZE {
        return CUresult::ERROR_UNSUPPORTED_LIMIT;
    }
    let mut stack = STACK.lock().unwrap_or_else(|e| e.into_inner());
    stack.0 = value;
    stack.1.push(value);
    CUresult::SUCCESS
}
