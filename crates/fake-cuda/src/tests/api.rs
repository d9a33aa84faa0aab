//! Safe wrappers over the exported entry points, for tests.

use std::ffi::{c_int, c_void};

use cuda_abi::{
    CUcheckpointGpuPair, CUcheckpointLockArgs, CUcheckpointRestoreArgs, CUcontext, CUmemAccessDesc,
    CUmemAllocationProp, CUmemFabricHandle, CUmemLocation, CUresult, CUuuid, access_flags,
    allocation_type, handle_type, location_type,
};

use crate::exports as x;

pub(crate) const MIB: usize = 1 << 20;
pub(crate) const GRAN: usize = 2 * MIB;
pub(crate) const SUCCESS: CUresult = CUresult::SUCCESS;
pub(crate) const RW: u32 = access_flags::PROT_READWRITE;
pub(crate) const POSIX: u32 = handle_type::POSIX_FILE_DESCRIPTOR;
pub(crate) const FABRIC: u32 = handle_type::FABRIC;

pub(crate) fn ck(r: CUresult) -> Result<(), CUresult> {
    if r == SUCCESS { Ok(()) } else { Err(r) }
}

pub(crate) fn init() -> CUresult {
    cu!(x::cuInit(0))
}

/// cuInit, then the primary context of `dev` retained and made current.
pub(crate) fn init_ctx(dev: c_int) -> CUcontext {
    assert_eq!(init(), SUCCESS);
    let mut ctx: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut ctx, dev)), SUCCESS);
    assert_eq!(cu!(x::cuCtxSetCurrent(ctx)), SUCCESS);
    ctx
}

pub(crate) fn prop(dev: c_int, types: u32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: allocation_type::PINNED,
        requestedHandleTypes: types,
        location: CUmemLocation {
            type_: location_type::DEVICE,
            id: dev,
        },
        ..Default::default()
    }
}

pub(crate) fn mem_create(size: usize, prop: &CUmemAllocationProp) -> Result<u64, CUresult> {
    let mut h = 0;
    ck(cu!(x::cuMemCreate(&mut h, size, prop, 0)))?;
    Ok(h)
}

pub(crate) fn release(h: u64) -> CUresult {
    cu!(x::cuMemRelease(h))
}

pub(crate) fn reserve(size: usize, align: usize, addr: u64) -> Result<u64, CUresult> {
    let mut ptr = 0;
    ck(cu!(x::cuMemAddressReserve(&mut ptr, size, align, addr, 0)))?;
    Ok(ptr)
}

pub(crate) fn address_free(ptr: u64, size: usize) -> CUresult {
    cu!(x::cuMemAddressFree(ptr, size))
}

pub(crate) fn map(ptr: u64, size: usize, offset: usize, h: u64) -> CUresult {
    cu!(x::cuMemMap(ptr, size, offset, h, 0))
}

pub(crate) fn unmap(ptr: u64, size: usize) -> CUresult {
    cu!(x::cuMemUnmap(ptr, size))
}

pub(crate) fn set_access(ptr: u64, size: usize, access: &[(c_int, u32)]) -> CUresult {
    let descs: Vec<CUmemAccessDesc> = access
        .iter()
        .map(|&(id, flags)| CUmemAccessDesc {
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id,
            },
            flags,
        })
        .collect();
    cu!(x::cuMemSetAccess(ptr, size, descs.as_ptr(), descs.len()))
}

pub(crate) fn get_access(ptr: u64, dev: c_int) -> Result<u64, CUresult> {
    let mut flags = 0;
    let loc = CUmemLocation {
        type_: location_type::DEVICE,
        id: dev,
    };
    ck(cu!(x::cuMemGetAccess(&mut flags, &loc, ptr)))?;
    Ok(flags)
}

pub(crate) fn export_fd(h: u64) -> Result<c_int, CUresult> {
    let mut fd: c_int = -1;
    ck(cu!(x::cuMemExportToShareableHandle(
        (&mut fd as *mut c_int).cast(),
        h,
        POSIX,
        0
    )))?;
    Ok(fd)
}

pub(crate) fn import_fd(fd: c_int) -> Result<u64, CUresult> {
    let mut h = 0;
    ck(cu!(x::cuMemImportFromShareableHandle(
        &mut h,
        fd as usize as *mut c_void,
        POSIX
    )))?;
    Ok(h)
}

pub(crate) fn export_fabric(h: u64) -> Result<CUmemFabricHandle, CUresult> {
    let mut fh = CUmemFabricHandle { data: [0; 64] };
    ck(cu!(x::cuMemExportToShareableHandle(
        (&mut fh as *mut CUmemFabricHandle).cast(),
        h,
        FABRIC,
        0
    )))?;
    Ok(fh)
}

pub(crate) fn import_fabric(fh: &CUmemFabricHandle) -> Result<u64, CUresult> {
    let mut h = 0;
    let p = (fh as *const CUmemFabricHandle).cast_mut().cast();
    ck(cu!(x::cuMemImportFromShareableHandle(&mut h, p, FABRIC)))?;
    Ok(h)
}

pub(crate) fn write(dptr: u64, bytes: &[u8]) -> CUresult {
    cu!(x::cuMemcpyHtoD_v2(dptr, bytes.as_ptr().cast(), bytes.len()))
}

pub(crate) fn read(dptr: u64, len: usize) -> Result<Vec<u8>, CUresult> {
    let mut out = vec![0u8; len];
    ck(cu!(x::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), dptr, len)))?;
    Ok(out)
}

pub(crate) fn alloc(bytes: usize) -> Result<u64, CUresult> {
    let mut d = 0;
    ck(cu!(x::cuMemAlloc_v2(&mut d, bytes)))?;
    Ok(d)
}

pub(crate) fn free(dptr: u64) -> CUresult {
    cu!(x::cuMemFree_v2(dptr))
}

pub(crate) fn mem_info() -> Result<(usize, usize), CUresult> {
    let (mut free, mut total) = (0, 0);
    ck(cu!(x::cuMemGetInfo_v2(&mut free, &mut total)))?;
    Ok((free, total))
}

pub(crate) fn usage(pid: i32, dev: c_int) -> u64 {
    x::fakeCudaUsage(pid, dev)
}

/// A VMM buffer of `size` bytes on `dev`: created, reserved, mapped, read-write.
pub(crate) fn vmm_buffer(size: usize, dev: c_int, types: u32) -> (u64, u64) {
    let h = mem_create(size, &prop(dev, types)).unwrap();
    let ptr = reserve(size, 0, 0).unwrap();
    assert_eq!(map(ptr, size, 0, h), SUCCESS);
    assert_eq!(set_access(ptr, size, &[(dev, RW)]), SUCCESS);
    (h, ptr)
}

pub(crate) fn uuid(dev: c_int) -> [u8; 16] {
    let mut u = CUuuid::default();
    assert_eq!(cu!(x::cuDeviceGetUuid(&mut u, dev)), SUCCESS);
    u.bytes.map(|b| b as u8)
}

pub(crate) fn lock(pid: i32, timeout_ms: u32) -> CUresult {
    let mut args = CUcheckpointLockArgs {
        timeoutMs: timeout_ms,
        ..Default::default()
    };
    cu!(x::cuCheckpointProcessLock(pid, &mut args))
}

pub(crate) fn checkpoint(pid: i32) -> CUresult {
    cu!(x::cuCheckpointProcessCheckpoint(pid, std::ptr::null_mut()))
}

pub(crate) fn restore(pid: i32, pairs: &[([u8; 16], [u8; 16])]) -> CUresult {
    let mut raw: Vec<CUcheckpointGpuPair> = pairs
        .iter()
        .map(|(old, new)| CUcheckpointGpuPair {
            oldUuid: CUuuid {
                bytes: old.map(|b| b as std::ffi::c_char),
            },
            newUuid: CUuuid {
                bytes: new.map(|b| b as std::ffi::c_char),
            },
        })
        .collect();
    let mut args = CUcheckpointRestoreArgs {
        gpuPairs: if raw.is_empty() {
            std::ptr::null_mut()
        } else {
            raw.as_mut_ptr()
        },
        gpuPairsCount: raw.len() as u32,
        ..Default::default()
    };
    cu!(x::cuCheckpointProcessRestore(pid, &mut args))
}

pub(crate) fn unlock(pid: i32) -> CUresult {
    cu!(x::cuCheckpointProcessUnlock(pid, std::ptr::null_mut()))
}

pub(crate) fn state(pid: i32) -> Result<u32, CUresult> {
    let mut s = 99;
    ck(cu!(x::cuCheckpointProcessGetState(pid, &mut s)))?;
    Ok(s)
}

/// Names of this process's descriptors that belong to the fake (memfds, usage files).
pub(crate) fn fake_fds(pid: i32) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        if let Ok(link) = std::fs::read_link(entry.path()) {
            let link = link.to_string_lossy().into_owned();
            if link.contains("fake-cuda") || link.contains("/usage-") {
                out.push(link);
            }
        }
    }
    out
}

/// Parses "0x..." or decimal.
pub(crate) fn num(text: &str) -> u64 {
    let t = text.trim();
    match t.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
        None => t.parse().unwrap(),
    }
}
