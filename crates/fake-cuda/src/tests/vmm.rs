//! The VMM API in one process: every error path returns the real driver's code; access, copies
//! and memsets; legacy allocations.

use std::ffi::c_void;

use cuda_abi::{CUmemAllocationProp, CUresult, access_flags, handle_type, location_type};

use super::*;
use crate::exports as x;

const INVALID: CUresult = CUresult::ERROR_INVALID_VALUE;
/// What r580 returns for several `cuMemMap` range errors (measured 2026-12-02).
const NOT_SUPPORTED: CUresult = CUresult::ERROR_NOT_SUPPORTED;

isolated_test!(vmm_error_paths_return_the_real_codes, &[], {
    // cuMemCreate with no current context is legal.
    assert_eq!(init(), SUCCESS);
    let p = prop(0, POSIX);
    let h = mem_create(GRAN, &p).unwrap();

    // cuMemCreate: null pointers, sizes, flags, properties.
    assert_eq!(
        cu!(x::cuMemCreate(std::ptr::null_mut(), GRAN, &p, 0)),
        INVALID
    );
    let mut out = 0;
    assert_eq!(
        cu!(x::cuMemCreate(&mut out, GRAN, std::ptr::null(), 0)),
        INVALID
    );
    assert_eq!(cu!(x::cuMemCreate(&mut out, GRAN, &p, 1)), INVALID);
    assert_eq!(mem_create(0, &p), Err(INVALID));
    assert_eq!(mem_create(GRAN + 4096, &p), Err(INVALID));
    let bad_type = CUmemAllocationProp { type_: 0, ..p };
    assert_eq!(mem_create(GRAN, &bad_type), Err(INVALID));
    let mut host = p;
    host.location.type_ = location_type::HOST;
    assert_eq!(mem_create(GRAN, &host), Err(CUresult::ERROR_NOT_SUPPORTED));
    let mut nowhere = p;
    nowhere.location.type_ = 77;
    assert_eq!(mem_create(GRAN, &nowhere), Err(INVALID));
    assert_eq!(
        mem_create(GRAN, &prop(5, 0)),
        Err(CUresult::ERROR_INVALID_DEVICE)
    );
    assert_eq!(
        mem_create(GRAN, &prop(-1, 0)),
        Err(CUresult::ERROR_INVALID_DEVICE)
    );
    assert_eq!(
        mem_create(GRAN, &prop(0, handle_type::WIN32)),
        Err(CUresult::ERROR_NOT_SUPPORTED)
    );
    assert_eq!(mem_create(GRAN, &prop(0, 0x100)), Err(INVALID));
    assert_eq!(
        mem_create(16 << 30, &prop(0, 0)),
        Err(CUresult::ERROR_OUT_OF_MEMORY)
    );

    // Granularity.
    let mut g = 0;
    assert_eq!(
        cu!(x::cuMemGetAllocationGranularity(&mut g, &p, 0)),
        SUCCESS
    );
    assert_eq!(g, GRAN);
    assert_eq!(
        cu!(x::cuMemGetAllocationGranularity(&mut g, &p, 1)),
        SUCCESS
    );
    assert_eq!(g, GRAN);
    assert_eq!(
        cu!(x::cuMemGetAllocationGranularity(&mut g, &p, 2)),
        INVALID
    );
    assert_eq!(
        cu!(x::cuMemGetAllocationGranularity(
            &mut g,
            std::ptr::null(),
            0
        )),
        INVALID
    );
    // r580 does not look at the location id here.
    assert_eq!(
        cu!(x::cuMemGetAllocationGranularity(
            &mut g,
            &prop(9999, POSIX),
            0
        )),
        SUCCESS
    );

    // Reservations.
    let mut ptr = 0;
    assert_eq!(
        cu!(x::cuMemAddressReserve(std::ptr::null_mut(), GRAN, 0, 0, 0)),
        INVALID
    );
    assert_eq!(
        cu!(x::cuMemAddressReserve(&mut ptr, GRAN, 0, 0, 1)),
        INVALID
    );
    assert_eq!(reserve(0, 0, 0), Err(INVALID));
    assert_eq!(reserve(GRAN + 1, 0, 0), Err(INVALID));
    assert_eq!(reserve(GRAN, 3 * MIB, 0), Err(INVALID));
    let va = reserve(4 * GRAN, 4 * GRAN, 0).unwrap();
    assert_eq!(va % (4 * GRAN) as u64, 0, "alignment honoured");
    assert_eq!(
        address_free(va, GRAN),
        INVALID,
        "size must match the reservation"
    );
    assert_eq!(address_free(va + GRAN as u64, 3 * GRAN), INVALID);

    // Map.
    assert_eq!(map(va, GRAN, 0, h + 999), INVALID, "unknown handle");
    assert_eq!(map(va + 4096, GRAN, 0, h), INVALID, "unaligned address");
    assert_eq!(map(va, GRAN + 4096, 0, h), NOT_SUPPORTED, "unaligned size");
    assert_eq!(map(va, GRAN, 4096, h), NOT_SUPPORTED, "unaligned offset");
    assert_eq!(map(va, 0, 0, h), INVALID, "size 0");
    assert_eq!(
        map(va, 2 * GRAN, 0, h),
        NOT_SUPPORTED,
        "bigger than the allocation"
    );
    assert_eq!(
        map(va, GRAN, GRAN, h),
        NOT_SUPPORTED,
        "offset past the allocation"
    );
    assert_eq!(cu!(x::cuMemMap(va, GRAN, 0, h, 1)), INVALID, "flags");
    let unreserved = reserve(GRAN, 0, 0).unwrap();
    assert_eq!(address_free(unreserved, GRAN), SUCCESS);
    assert_eq!(map(unreserved, GRAN, 0, h), INVALID, "not reserved");
    let two = mem_create(2 * GRAN, &prop(0, 0)).unwrap();
    assert_eq!(
        map(va + 3 * GRAN as u64, 2 * GRAN, 0, two),
        INVALID,
        "past the reservation"
    );
    assert_eq!(map(va, GRAN, 0, h), SUCCESS);
    assert_eq!(map(va, GRAN, 0, h), INVALID, "over a mapped range");
    assert_eq!(address_free(va, 4 * GRAN), INVALID, "still mapped");

    // Access.
    let desc = cuda_abi::CUmemAccessDesc {
        location: cuda_abi::CUmemLocation {
            type_: location_type::DEVICE,
            id: 0,
        },
        flags: RW,
    };
    assert_eq!(
        cu!(x::cuMemSetAccess(va, GRAN, std::ptr::null(), 1)),
        INVALID
    );
    assert_eq!(cu!(x::cuMemSetAccess(va, GRAN, &desc, 0)), INVALID);
    assert_eq!(
        set_access(va, 2 * GRAN, &[(0, RW)]),
        INVALID,
        "partly unmapped"
    );
    assert_eq!(
        set_access(va + GRAN as u64, GRAN, &[(0, RW)]),
        INVALID,
        "unmapped"
    );
    assert_eq!(set_access(va, GRAN, &[(0, 2)]), INVALID, "bad flags");
    assert_eq!(set_access(va, GRAN, &[(3, RW)]), INVALID, "no such device");
    assert_eq!(
        get_access(va, 0),
        Ok(0),
        "inaccessible until cuMemSetAccess"
    );
    assert_eq!(get_access(va + GRAN as u64, 0), Err(INVALID), "unmapped");
    assert_eq!(get_access(va, 9), Err(CUresult::ERROR_INVALID_DEVICE));

    // Export: types the allocation was not created with, unsupported types, nulls, flags.
    assert!(export_fd(h).is_ok());
    let plain = mem_create(GRAN, &prop(0, 0)).unwrap();
    assert_eq!(export_fd(plain), Err(INVALID));
    assert_eq!(export_fabric(h).map(|_| ()), Err(INVALID));
    let mut fd = -1;
    let fdp = (&mut fd as *mut i32).cast::<c_void>();
    assert_eq!(
        cu!(x::cuMemExportToShareableHandle(
            fdp,
            h,
            handle_type::WIN32,
            0
        )),
        CUresult::ERROR_NOT_SUPPORTED
    );
    assert_eq!(cu!(x::cuMemExportToShareableHandle(fdp, h, 0, 0)), INVALID);
    assert_eq!(
        cu!(x::cuMemExportToShareableHandle(fdp, h, POSIX, 1)),
        INVALID
    );
    assert_eq!(
        cu!(x::cuMemExportToShareableHandle(
            std::ptr::null_mut(),
            h,
            POSIX,
            0
        )),
        INVALID
    );

    // Import: not a descriptor, not the fake's memfd (r580: CUDA_ERROR_UNKNOWN), wrong type, Win32.
    let unknown = Err(CUresult::ERROR_UNKNOWN);
    assert_eq!(import_fd(-1), unknown);
    assert_eq!(import_fd(9999), unknown);
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(import_fd(file.as_raw_fd()), unknown, "a foreign file");
    let mut ih = 0;
    assert_eq!(
        cu!(x::cuMemImportFromShareableHandle(
            &mut ih,
            std::ptr::null_mut(),
            handle_type::WIN32
        )),
        CUresult::ERROR_NOT_SUPPORTED
    );
    assert_eq!(
        cu!(x::cuMemImportFromShareableHandle(
            &mut ih,
            std::ptr::null_mut(),
            FABRIC
        )),
        INVALID
    );
    let garbage = cuda_abi::CUmemFabricHandle { data: [7; 64] };
    assert_eq!(import_fabric(&garbage), Err(INVALID));

    // Unmap: partial, unaligned; a reserved range with nothing mapped is a success on r580.
    assert_eq!(unmap(va, 2 * GRAN), INVALID, "includes an unmapped part");
    assert_eq!(unmap(va + GRAN as u64, GRAN), SUCCESS, "nothing mapped");
    assert_eq!(
        get_access(va, 0),
        Ok(0),
        "the mapping beside it is untouched"
    );
    assert_eq!(unmap(unreserved, GRAN), INVALID, "not reserved");
    assert_eq!(unmap(va + 4096, GRAN), INVALID);
    let big = mem_create(2 * GRAN, &prop(0, 0)).unwrap();
    assert_eq!(map(va + 2 * GRAN as u64, 2 * GRAN, 0, big), SUCCESS);
    assert_eq!(
        unmap(va + 2 * GRAN as u64, GRAN),
        INVALID,
        "part of a mapping"
    );
    // Access set on part of a mapping splits it, but the mapping still unmaps only whole.
    assert_eq!(set_access(va + 3 * GRAN as u64, GRAN, &[(0, RW)]), SUCCESS);
    assert_eq!(get_access(va + 3 * GRAN as u64, 0), Ok(u64::from(RW)));
    assert_eq!(get_access(va + 2 * GRAN as u64, 0), Ok(0));
    assert_eq!(
        unmap(va + 3 * GRAN as u64, GRAN),
        INVALID,
        "part of a split mapping"
    );
    assert_eq!(unmap(va + 2 * GRAN as u64, 2 * GRAN), SUCCESS);

    // Retain / properties.
    let mut rh = 0;
    assert_eq!(
        cu!(x::cuMemRetainAllocationHandle(
            &mut rh,
            va as usize as *mut c_void
        )),
        SUCCESS
    );
    assert_eq!(rh, h);
    assert_eq!(
        cu!(x::cuMemRetainAllocationHandle(
            &mut rh,
            (va + 3 * GRAN as u64) as usize as *mut c_void
        )),
        INVALID
    );
    assert_eq!(release(rh), SUCCESS, "the retain's reference");
    let mut got = CUmemAllocationProp::default();
    assert_eq!(
        cu!(x::cuMemGetAllocationPropertiesFromHandle(&mut got, h)),
        SUCCESS
    );
    assert_eq!(
        (got.requestedHandleTypes, got.location.id, got.type_),
        (POSIX, 0, 1)
    );
    assert_eq!(
        cu!(x::cuMemGetAllocationPropertiesFromHandle(
            std::ptr::null_mut(),
            h
        )),
        INVALID
    );

    // Release: a mapped allocation stays alive; releasing twice fails; then it is invalid.
    assert_eq!(release(h), SUCCESS);
    assert_eq!(release(h), INVALID, "released twice");
    assert_eq!(export_fd(h), Err(INVALID), "released handle");
    assert_eq!(release(big), SUCCESS);
    assert_eq!(release(big), INVALID);
    assert_eq!(release(plain), SUCCESS);
    assert_eq!(release(two), SUCCESS);
    assert_eq!(release(0), INVALID);
    assert!(
        usage(std::process::id() as i32, 0) > 0,
        "the mapping keeps the memory"
    );
    assert_eq!(unmap(va, GRAN), SUCCESS);
    assert_eq!(
        usage(std::process::id() as i32, 0),
        0,
        "freed with its last mapping"
    );
    assert_eq!(address_free(va, 4 * GRAN), SUCCESS);
    assert_eq!(address_free(va, 4 * GRAN), INVALID, "freed twice");
    // SAFETY: close the exported descriptor (ours).
    unsafe { libc::close(fd) };
});

isolated_test!(access_controls_copies_and_memsets, &[], {
    init_ctx(0);
    let h = mem_create(2 * GRAN, &prop(0, 0)).unwrap();
    let va = reserve(2 * GRAN, 0, 0).unwrap();
    assert_eq!(map(va, 2 * GRAN, 0, h), SUCCESS);
    // Inaccessible until cuMemSetAccess: copies fail, never fault.
    assert_eq!(write(va, b"hello"), INVALID);
    assert_eq!(read(va, 5), Err(INVALID));
    // Read-only: reads work, writes and memsets fail.
    assert_eq!(
        set_access(va, 2 * GRAN, &[(0, access_flags::PROT_READ)]),
        SUCCESS
    );
    assert_eq!(read(va, 5), Ok(vec![0; 5]));
    assert_eq!(write(va, b"hello"), INVALID);
    assert_eq!(cu!(x::cuMemsetD8_v2(va, 1, 10)), INVALID);
    // Read-write on device 1 also makes the range host-accessible for copies.
    assert_eq!(set_access(va, 2 * GRAN, &[(0, RW), (1, RW)]), SUCCESS);
    assert_eq!(write(va, b"hello"), SUCCESS);
    assert_eq!(read(va, 5).unwrap(), b"hello");
    // Copies spanning the whole mapping, device to device, memsets.
    assert_eq!(cu!(x::cuMemcpyDtoD_v2(va + GRAN as u64, va, 5)), SUCCESS);
    assert_eq!(read(va + GRAN as u64, 5).unwrap(), b"hello");
    assert_eq!(cu!(x::cuMemsetD8_v2(va + 10, 0xab, 6)), SUCCESS);
    assert_eq!(read(va + 10, 6).unwrap(), vec![0xab; 6]);
    assert_eq!(cu!(x::cuMemsetD32_v2(va + 16, 0x0102_0304, 2)), SUCCESS);
    assert_eq!(read(va + 16, 8).unwrap(), [4, 3, 2, 1, 4, 3, 2, 1]);
    assert_eq!(cu!(x::cuMemsetD32_v2(va + 17, 1, 2)), INVALID);
    // Async variants on a stream and the legacy stream.
    let mut s = std::ptr::null_mut();
    assert_eq!(cu!(x::cuStreamCreate(&mut s, 1)), SUCCESS);
    let src = [9u8; 32];
    assert_eq!(
        cu!(x::cuMemcpyHtoDAsync_v2(
            va + 100,
            src.as_ptr().cast(),
            32,
            s
        )),
        SUCCESS
    );
    // Streams are asynchronous: the copy on `s` is complete once `s` is synchronized (the
    // legacy stream is another queue, and `s` is non-blocking).
    assert_eq!(cu!(x::cuStreamSynchronize(s)), SUCCESS);
    let mut dst = [0u8; 32];
    assert_eq!(
        cu!(x::cuMemcpyDtoHAsync_v2(
            dst.as_mut_ptr().cast(),
            va + 100,
            32,
            1 as cuda_abi::CUstream,
        )),
        SUCCESS
    );
    assert_eq!(
        cu!(x::cuStreamSynchronize(1 as cuda_abi::CUstream)),
        SUCCESS
    );
    assert_eq!(dst, src);
    assert_eq!(
        cu!(x::cuMemcpyDtoDAsync_v2(va + 200, va + 100, 32, s)),
        SUCCESS
    );
    assert_eq!(cu!(x::cuMemsetD8Async(va + 300, 5, 3, s)), SUCCESS);
    assert_eq!(cu!(x::cuMemsetD32Async(va + 304, 6, 1, s)), SUCCESS);
    assert_eq!(read(va + 300, 8).unwrap(), [5, 5, 5, 0, 6, 0, 0, 0]);
    assert_eq!(
        cu!(x::cuMemsetD8Async(va, 5, 3, 0x9999 as cuda_abi::CUstream)),
        CUresult::ERROR_INVALID_HANDLE
    );
    // Out of the mapping, bad host pointers: errors, not faults.
    assert_eq!(read(va + 2 * GRAN as u64 - 2, 4), Err(INVALID));
    assert_eq!(write(0x10, b"x"), INVALID);
    assert_eq!(
        cu!(x::cuMemcpyHtoD_v2(va, 0x10 as *const c_void, 8)),
        INVALID
    );
    assert_eq!(cu!(x::cuMemcpyDtoH_v2(0x10 as *mut c_void, va, 8)), INVALID);
    // A "host" pointer into an inaccessible device range is refused too.
    assert_eq!(
        set_access(va + GRAN as u64, GRAN, &[(0, 0), (1, 0)]),
        SUCCESS
    );
    assert_eq!(
        cu!(x::cuMemcpyDtoH_v2(
            (va + GRAN as u64) as usize as *mut c_void,
            va,
            8
        )),
        INVALID
    );
    // The mapping's memory really is at the device address.
    // SAFETY: the first granule is mapped read-write.
    assert_eq!(unsafe { *(va as usize as *const u8) }, b'h');
    // cuMemGetAddressRange reports the whole mapping.
    let (mut base, mut size) = (0, 0);
    assert_eq!(
        cu!(x::cuMemGetAddressRange_v2(
            &mut base,
            &mut size,
            va + GRAN as u64 + 5
        )),
        SUCCESS
    );
    assert_eq!((base, size), (va, 2 * GRAN));
    assert_eq!(unmap(va, 2 * GRAN), SUCCESS);
    assert_eq!(read(va, 1), Err(INVALID), "unmapped");
    assert_eq!(release(h), SUCCESS);
});

isolated_test!(legacy_allocations, &[("FAKE_CUDA_DEVICE_MEMORY", "64M")], {
    init_ctx(1);
    let me = std::process::id() as i32;
    assert_eq!(alloc(0), Err(INVALID));
    assert_eq!(cu!(x::cuMemAlloc_v2(std::ptr::null_mut(), 10)), INVALID);
    let a = alloc(1000).unwrap();
    let b = alloc(5 * MIB).unwrap();
    assert_eq!(usage(me, 1), (GRAN + 6 * MIB) as u64, "rounded to 2 MiB");
    assert_eq!(usage(me, 0), 0);
    let (available, total) = mem_info().unwrap();
    assert_eq!(total, 64 * MIB);
    assert_eq!(available, 64 * MIB - GRAN - 6 * MIB);
    assert_eq!(alloc(64 * MIB), Err(CUresult::ERROR_OUT_OF_MEMORY));
    assert_eq!(write(a, &[1, 2, 3]), SUCCESS);
    assert_eq!(cu!(x::cuMemcpyDtoD_v2(b + 10, a, 3)), SUCCESS);
    assert_eq!(read(b + 10, 3).unwrap(), [1, 2, 3]);
    assert_eq!(read(a + 999, 2), Err(INVALID), "past the requested size");
    let (mut base, mut size) = (0, 0);
    assert_eq!(
        cu!(x::cuMemGetAddressRange_v2(&mut base, &mut size, a + 500)),
        SUCCESS
    );
    assert_eq!((base, size), (a, 1000));
    assert_eq!(
        cu!(x::cuMemGetAddressRange_v2(
            std::ptr::null_mut(),
            &mut size,
            b
        )),
        SUCCESS
    );
    assert_eq!(
        cu!(x::cuMemGetAddressRange_v2(&mut base, &mut size, 0x1000)),
        CUresult::ERROR_NOT_FOUND
    );
    assert_eq!(free(a + 1), INVALID, "not the base");
    assert_eq!(free(a), SUCCESS);
    assert_eq!(free(a), INVALID, "freed twice");
    assert_eq!(unmap(b, GRAN), INVALID, "not a VMM mapping");
    assert_eq!(free(b), SUCCESS);
    assert_eq!(usage(me, -1), 0);
    let mut v1 = (0u32, 0u32);
    assert_eq!(cu!(x::cuMemGetInfo(&mut v1.0, &mut v1.1)), SUCCESS);
    assert_eq!(v1.1 as usize, 64 * MIB);
});
