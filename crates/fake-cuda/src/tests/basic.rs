//! Initialisation, devices, contexts, streams, error strings, cuGetProcAddress, fault injection.

use std::ffi::{CStr, c_char, c_int, c_void};

use cuda_abi::{CUcontext, CUresult, CUstream, device_attribute as attr, proc_address_status};

use super::*;
use crate::exports as x;

/// cuGetProcAddress needs no initialisation and touches no state: safe in the test process.
#[test]
fn proc_address_hands_out_the_drivers_own_functions() {
    let mut p: *mut c_void = std::ptr::null_mut();
    let mut status: c_int = -1;
    // SAFETY: NUL-terminated name, writable slots.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemAlloc".as_ptr(),
        &mut p,
        13000,
        0,
        &mut status
    ));
    assert_eq!(r, SUCCESS);
    assert_eq!(status, proc_address_status::SUCCESS);
    assert_eq!(p, x::cuMemAlloc_v2 as *mut c_void);

    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemCreate".as_ptr(),
        &mut p,
        12000,
        2,
        &mut status
    ));
    assert_eq!(
        (r, p),
        (SUCCESS, x::cuMemCreate as *mut c_void),
        "per-thread flag"
    );

    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMulticastBindMem".as_ptr(),
        &mut p,
        13000,
        0,
        &mut status,
    ));
    assert_eq!((r, p), (SUCCESS, x::cuMulticastBindMem as *mut c_void));

    // The per-thread spelling resolves the same functions.
    let r = cu!(x::cuGetProcAddress_v2_ptsz(
        c"cuMemAlloc".as_ptr(),
        &mut p,
        13000,
        0,
        &mut status
    ));
    assert_eq!((r, p), (SUCCESS, x::cuMemAlloc_v2 as *mut c_void));

    // Unknown symbol: v2 succeeds with NULL and a status, v1 fails.
    p = std::ptr::dangling_mut::<c_void>();
    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuNoSuchThing".as_ptr(),
        &mut p,
        13000,
        0,
        &mut status
    ));
    assert_eq!(
        (r, p.is_null(), status),
        (SUCCESS, true, proc_address_status::SYMBOL_NOT_FOUND)
    );
    let r = cu!(x::cuGetProcAddress(
        c"cuNoSuchThing".as_ptr(),
        &mut p,
        13000,
        0
    ));
    assert_eq!((r, p.is_null()), (CUresult::ERROR_NOT_FOUND, true));
    // Versioned names are not base names.
    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemAlloc_v2".as_ptr(),
        &mut p,
        13000,
        0,
        &mut status
    ));
    assert_eq!(
        (r, status),
        (SUCCESS, proc_address_status::SYMBOL_NOT_FOUND)
    );
    // Too old a version.
    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemCreate".as_ptr(),
        &mut p,
        10000,
        0,
        &mut status
    ));
    assert_eq!(
        (r, status, p.is_null()),
        (SUCCESS, proc_address_status::VERSION_NOT_SUFFICIENT, true)
    );
    let r = cu!(x::cuGetProcAddress(
        c"cuMemCreate".as_ptr(),
        &mut p,
        10000,
        0
    ));
    assert_eq!(r, CUresult::ERROR_NOT_FOUND);
    // A version above the driver's, bad flags, null arguments.
    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemAlloc".as_ptr(),
        &mut p,
        13010,
        0,
        &mut status
    ));
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    // SAFETY: as above.
    let r = cu!(x::cuGetProcAddress_v2(
        c"cuMemAlloc".as_ptr(),
        &mut p,
        13000,
        4,
        &mut status
    ));
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    let r = cu!(x::cuGetProcAddress_v2(
        std::ptr::null(),
        &mut p,
        13000,
        0,
        &mut status
    ));
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    let r = cu!(x::cuGetProcAddress(
        c"cuInit".as_ptr(),
        std::ptr::null_mut(),
        13000,
        0
    ));
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
}

/// Error strings and the version need no initialisation either.
#[test]
fn error_strings_and_version() {
    let mut s: *const c_char = std::ptr::null();
    assert_eq!(
        cu!(x::cuGetErrorName(CUresult::ERROR_INVALID_VALUE, &mut s)),
        SUCCESS
    );
    // SAFETY: the driver returned a static NUL-terminated string.
    assert_eq!(unsafe { CStr::from_ptr(s) }, c"CUDA_ERROR_INVALID_VALUE");
    assert_eq!(
        cu!(x::cuGetErrorString(CUresult::ERROR_OUT_OF_MEMORY, &mut s)),
        SUCCESS
    );
    // SAFETY: as above.
    assert_eq!(unsafe { CStr::from_ptr(s) }, c"out of memory");
    let r = cu!(x::cuGetErrorName(CUresult(123_456), &mut s));
    assert_eq!((r, s.is_null()), (CUresult::ERROR_INVALID_VALUE, true));
    let r = cu!(x::cuGetErrorString(CUresult::SUCCESS, std::ptr::null_mut()));
    assert_eq!(r, CUresult::ERROR_INVALID_VALUE);
    let mut v = 0;
    assert_eq!(cu!(x::cuDriverGetVersion(&mut v)), SUCCESS);
    assert_eq!(v, 13000);
}

fn attribute(a: c_int, dev: c_int) -> Result<c_int, CUresult> {
    let mut v = -1;
    ck(cu!(x::cuDeviceGetAttribute(&mut v, a, dev)))?;
    Ok(v)
}

isolated_test!(
    devices_follow_the_environment,
    &[
        ("FAKE_CUDA_DEVICES", "3"),
        ("FAKE_CUDA_MULTICAST", "0"),
        ("FAKE_CUDA_DEVICE_MEMORY", "1G")
    ],
    {
        let mut n = 0;
        assert_eq!(
            cu!(x::cuDeviceGetCount(&mut n)),
            CUresult::ERROR_NOT_INITIALIZED
        );
        assert_eq!(cu!(x::cuInit(1)), CUresult::ERROR_INVALID_VALUE);
        assert_eq!(init(), SUCCESS);
        assert_eq!(init(), SUCCESS, "idempotent");
        assert_eq!(cu!(x::cuDeviceGetCount(&mut n)), SUCCESS);
        assert_eq!(n, 3);
        let mut dev = -1;
        assert_eq!(cu!(x::cuDeviceGet(&mut dev, 2)), SUCCESS);
        assert_eq!(dev, 2);
        assert_eq!(
            cu!(x::cuDeviceGet(&mut dev, 3)),
            CUresult::ERROR_INVALID_DEVICE
        );
        let uuids: Vec<[u8; 16]> = (0..3).map(uuid).collect();
        assert_ne!(uuids[0], uuids[1]);
        assert_ne!(uuids[1], uuids[2]);
        let mut total = 0;
        assert_eq!(cu!(x::cuDeviceTotalMem_v2(&mut total, 1)), SUCCESS);
        assert_eq!(total, 1 << 30);
        let mut name = [0 as c_char; 64];
        assert_eq!(cu!(x::cuDeviceGetName(name.as_mut_ptr(), 64, 0)), SUCCESS);
        // SAFETY: NUL-terminated by the driver.
        let text = unsafe { CStr::from_ptr(name.as_ptr()) };
        assert!(text.to_string_lossy().starts_with("NVIDIA"));
        assert_eq!(cu!(x::cuDeviceGetName(name.as_mut_ptr(), 4, 0)), SUCCESS);
        assert_eq!(name[3], 0);
        assert_eq!(
            attribute(attr::VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
            Ok(1)
        );
        assert_eq!(
            attribute(attr::HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
            Ok(1)
        );
        assert_eq!(attribute(attr::HANDLE_TYPE_FABRIC_SUPPORTED, 0), Ok(1));
        assert_eq!(attribute(attr::MULTICAST_SUPPORTED, 2), Ok(0));
        assert_eq!(attribute(attr::COMPUTE_CAPABILITY_MAJOR, 0), Ok(9));
        assert_eq!(attribute(0, 0), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(attribute(10_000, 0), Err(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(
            attribute(attr::MULTIPROCESSOR_COUNT, 7),
            Err(CUresult::ERROR_INVALID_DEVICE)
        );
        assert_eq!(
            cu!(x::cuDeviceGetAttribute(std::ptr::null_mut(), 1, 0)),
            CUresult::ERROR_INVALID_VALUE
        );
    }
);

isolated_test!(no_devices_fails_init, &[("FAKE_CUDA_DEVICES", "0")], {
    assert_eq!(init(), CUresult::ERROR_NO_DEVICE);
    assert_eq!(
        init(),
        CUresult::ERROR_NO_DEVICE,
        "the first result is final"
    );
});

isolated_test!(
    malformed_environment_fails_init,
    &[("FAKE_CUDA_DEVICES", "many")],
    {
        assert_eq!(init(), CUresult::ERROR_INVALID_VALUE);
    }
);

isolated_test!(contexts_and_streams, &[], {
    assert_eq!(init(), SUCCESS);
    let mut ctx: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(x::cuCtxGetCurrent(&mut ctx)), SUCCESS);
    assert!(ctx.is_null());
    assert_eq!(alloc(100), Err(CUresult::ERROR_INVALID_CONTEXT));
    assert_eq!(mem_info(), Err(CUresult::ERROR_INVALID_CONTEXT));
    let mut dev = -1;
    assert_eq!(
        cu!(x::cuCtxGetDevice(&mut dev)),
        CUresult::ERROR_INVALID_CONTEXT
    );
    assert_eq!(cu!(x::cuCtxSynchronize()), CUresult::ERROR_INVALID_CONTEXT);

    let mut primary: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut primary, 1)), SUCCESS);
    let mut again: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut again, 1)), SUCCESS);
    assert_eq!(primary, again, "one primary context per device");
    assert_eq!(cu!(x::cuCtxSetCurrent(primary)), SUCCESS);
    assert_eq!(cu!(x::cuCtxGetDevice(&mut dev)), SUCCESS);
    assert_eq!(dev, 1);
    assert_eq!(
        cu!(x::cuCtxSetCurrent(0x1234 as CUcontext)),
        CUresult::ERROR_INVALID_CONTEXT
    );

    let mut s: CUstream = std::ptr::null_mut();
    assert_eq!(cu!(x::cuStreamCreate(&mut s, 0)), SUCCESS);
    assert_eq!(cu!(x::cuStreamSynchronize(s)), SUCCESS);
    assert_eq!(cu!(x::cuStreamSynchronize(std::ptr::null_mut())), SUCCESS);
    assert_eq!(
        cu!(x::cuStreamSynchronize(0x777 as CUstream)),
        CUresult::ERROR_INVALID_HANDLE
    );
    assert_eq!(
        cu!(x::cuStreamCreate(&mut s, 4)),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(cu!(x::cuStreamDestroy_v2(s)), SUCCESS);
    assert_eq!(
        cu!(x::cuStreamDestroy_v2(s)),
        CUresult::ERROR_INVALID_HANDLE
    );

    // The stack size limit, per context, 0 included; other limits are not modelled.
    let mut stack = 0usize;
    let stack_limit = cuda_abi::limit::STACK_SIZE;
    assert_eq!(cu!(x::cuCtxGetLimit(&mut stack, stack_limit)), SUCCESS);
    assert_eq!(stack, 1024, "r580's default");
    assert_eq!(cu!(x::cuCtxSetLimit(stack_limit, 0)), SUCCESS);
    assert_eq!(cu!(x::cuCtxGetLimit(&mut stack, stack_limit)), SUCCESS);
    assert_eq!(stack, 0);
    assert_eq!(
        cu!(x::cuCtxSetLimit(1, 0)),
        CUresult::ERROR_UNSUPPORTED_LIMIT
    );
    assert_eq!(
        cu!(x::cuCtxGetLimit(std::ptr::null_mut(), stack_limit)),
        CUresult::ERROR_INVALID_VALUE
    );

    // An explicit context becomes current; its memory goes with it.
    let mut explicit: CUcontext = std::ptr::null_mut();
    assert_eq!(cu!(x::cuCtxCreate_v2(&mut explicit, 0, 0)), SUCCESS);
    assert_eq!(cu!(x::cuCtxGetCurrent(&mut ctx)), SUCCESS);
    assert_eq!(ctx, explicit);
    assert_eq!(cu!(x::cuCtxGetLimit(&mut stack, stack_limit)), SUCCESS);
    assert_eq!(stack, 1024, "a limit of the primary context only");
    let d = alloc(1000).unwrap();
    assert_eq!(usage(std::process::id() as i32, 0), GRAN as u64);
    assert_eq!(cu!(x::cuCtxDestroy_v2(explicit)), SUCCESS);
    assert_eq!(
        usage(std::process::id() as i32, 0),
        0,
        "destroying the context freed it"
    );
    assert_eq!(free(d), CUresult::ERROR_INVALID_VALUE);
    assert_eq!(
        cu!(x::cuCtxDestroy_v2(primary)),
        CUresult::ERROR_INVALID_CONTEXT
    );
    // cuCtxCreate_v4 without parameters is cuCtxCreate_v2.
    assert_eq!(
        cu!(x::cuCtxCreate_v4(&mut explicit, std::ptr::null_mut(), 0, 1)),
        SUCCESS
    );
    assert_eq!(cu!(x::cuCtxDestroy_v2(explicit)), SUCCESS);

    // Primary release: retained twice, released twice, then refused.
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(1)), SUCCESS);
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(1)), SUCCESS);
    assert_eq!(
        cu!(x::cuDevicePrimaryCtxRelease_v2(1)),
        CUresult::ERROR_INVALID_CONTEXT
    );
    assert_eq!(
        cu!(x::cuDevicePrimaryCtxRelease_v2(9)),
        CUresult::ERROR_INVALID_DEVICE
    );
});

isolated_test!(
    fault_injection_fails_the_nth_call,
    &[(
        "FAKE_CUDA_FAIL",
        "cuMemCreate:2,cuMemAlloc:1=CUDA_ERROR_INVALID_VALUE"
    )],
    {
        init_ctx(0);
        let p = prop(0, 0);
        let first = mem_create(GRAN, &p).unwrap();
        assert_eq!(mem_create(GRAN, &p), Err(CUresult::ERROR_OUT_OF_MEMORY));
        let third = mem_create(GRAN, &p).unwrap();
        assert_eq!(
            alloc(10),
            Err(CUresult::ERROR_INVALID_VALUE),
            "base name matches cuMemAlloc_v2"
        );
        let d = alloc(10).unwrap();
        assert_eq!(free(d), SUCCESS);
        assert_eq!(release(first), SUCCESS);
        assert_eq!(release(third), SUCCESS);
    }
);

isolated_test!(
    malformed_fault_spec_fails_init,
    &[("FAKE_CUDA_FAIL", "cuMemCreate")],
    {
        assert_eq!(init(), CUresult::ERROR_INVALID_VALUE);
    }
);

isolated_test!(pinned_host_memory, &[], {
    init_ctx(0);
    let mut p: *mut c_void = std::ptr::null_mut();
    assert_eq!(cu!(x::cuMemHostAlloc(&mut p, 3 * MIB, 0)), SUCCESS);
    assert_eq!(
        cu!(x::cuMemHostAlloc(&mut p, 10, 64)),
        CUresult::ERROR_INVALID_VALUE
    );
    let (_, dptr) = vmm_buffer(GRAN, 0, 0);
    assert_eq!(write(dptr, &[7u8; 64]), SUCCESS);
    // DtoH into pinned memory, then DtoD from pinned memory (UVA) back to the device.
    assert_eq!(cu!(x::cuMemcpyDtoH_v2(p, dptr, 64)), SUCCESS);
    // SAFETY: the pinned memory is ours.
    assert_eq!(unsafe { *p.cast::<u8>() }, 7);
    assert_eq!(
        usage(std::process::id() as i32, -1),
        GRAN as u64,
        "pinned memory is not device memory"
    );
    assert_eq!(cu!(x::cuMemFreeHost(p)), SUCCESS);
    assert_eq!(cu!(x::cuMemFreeHost(p)), CUresult::ERROR_INVALID_VALUE);
    let mut buf = vec![0u8; 8192];
    let bp = buf.as_mut_ptr().cast::<c_void>();
    assert_eq!(cu!(x::cuMemHostRegister_v2(bp, 8192, 0)), SUCCESS);
    assert_eq!(
        cu!(x::cuMemHostRegister_v2(bp, 100, 0)),
        CUresult::ERROR_HOST_MEMORY_ALREADY_REGISTERED
    );
    assert_eq!(cu!(x::cuMemHostUnregister(bp)), SUCCESS);
    assert_eq!(
        cu!(x::cuMemHostUnregister(bp)),
        CUresult::ERROR_HOST_MEMORY_NOT_REGISTERED
    );
    buf[0] = 1;
});

isolated_test!(a_copy_must_stay_inside_one_registration, &[], {
    init_ctx(0);
    let (_, dptr) = vmm_buffer(GRAN, 0, 0);
    let mut buf = vec![0u8; 4 * 4096];
    let bp = buf.as_mut_ptr();
    // Two adjacent registrations of 8 KiB, as a carrier pinned in pieces has.
    for piece in 0..2 {
        // SAFETY: inside `buf`.
        let at = unsafe { bp.add(piece * 8192) }.cast::<c_void>();
        assert_eq!(cu!(x::cuMemHostRegister_v2(at, 8192, 0)), SUCCESS);
    }
    // SAFETY: inside `buf`.
    let (first, second_half) = (
        bp.cast::<c_void>(),
        unsafe { bp.add(4096) }.cast::<c_void>(),
    );
    assert_eq!(cu!(x::cuMemcpyDtoH_v2(first, dptr, 8192)), SUCCESS);
    assert_eq!(
        cu!(x::cuMemcpyDtoH_v2(second_half, dptr, 8192)),
        CUresult::ERROR_INVALID_VALUE,
        "a host range over two registrations"
    );
    assert_eq!(
        cu!(x::cuMemcpyHtoD_v2(dptr, second_half.cast_const(), 8192)),
        CUresult::ERROR_INVALID_VALUE,
        "either way"
    );
    // SAFETY: inside `buf`.
    let second = unsafe { bp.add(8192) }.cast::<c_void>();
    assert_eq!(cu!(x::cuMemHostUnregister(second)), SUCCESS);
    assert_eq!(
        cu!(x::cuMemcpyDtoH_v2(second_half, dptr, 8192)),
        CUresult::ERROR_INVALID_VALUE,
        "a host range running off the end of a registration"
    );
    let plain = vec![0u8; 8192];
    assert_eq!(
        cu!(x::cuMemcpyHtoD_v2(dptr, plain.as_ptr().cast(), 8192)),
        SUCCESS,
        "pageable memory away from registrations copies"
    );
    assert_eq!(cu!(x::cuMemHostUnregister(first)), SUCCESS);
    buf[0] = 1;
});

isolated_test!(peer_access_between_contexts, &[], {
    assert_eq!(init(), SUCCESS);
    let (mut zero, mut one): (CUcontext, CUcontext) = (std::ptr::null_mut(), std::ptr::null_mut());
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut zero, 0)), SUCCESS);
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut one, 1)), SUCCESS);
    // No current context.
    assert_eq!(
        cu!(x::cuCtxEnablePeerAccess(one, 0)),
        CUresult::ERROR_INVALID_CONTEXT
    );
    assert_eq!(cu!(x::cuCtxSetCurrent(zero)), SUCCESS);
    assert_eq!(
        cu!(x::cuCtxEnablePeerAccess(one, 1)),
        CUresult::ERROR_INVALID_VALUE
    );
    assert_eq!(
        cu!(x::cuCtxEnablePeerAccess(zero, 0)),
        CUresult::ERROR_INVALID_DEVICE,
        "its own device is no peer"
    );
    assert_eq!(
        cu!(x::cuCtxDisablePeerAccess(one)),
        CUresult::ERROR_PEER_ACCESS_NOT_ENABLED
    );
    assert_eq!(cu!(x::cuCtxEnablePeerAccess(one, 0)), SUCCESS);
    assert_eq!(
        cu!(x::cuCtxEnablePeerAccess(one, 0)),
        CUresult::ERROR_PEER_ACCESS_ALREADY_ENABLED
    );
    assert_eq!(cu!(x::cuCtxDisablePeerAccess(one)), SUCCESS);
    assert_eq!(
        cu!(x::cuCtxDisablePeerAccess(one)),
        CUresult::ERROR_PEER_ACCESS_NOT_ENABLED
    );
    // Enabled again, then the peer goes: its access goes with it.
    assert_eq!(cu!(x::cuCtxEnablePeerAccess(one, 0)), SUCCESS);
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(1)), SUCCESS);
    assert_eq!(
        cu!(x::cuCtxDisablePeerAccess(one)),
        CUresult::ERROR_INVALID_CONTEXT
    );
    assert_eq!(cu!(x::cuDevicePrimaryCtxRetain(&mut one, 1)), SUCCESS);
    assert_eq!(
        cu!(x::cuCtxEnablePeerAccess(one, 0)),
        SUCCESS,
        "not left enabled"
    );
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(1)), SUCCESS);
    assert_eq!(cu!(x::cuDevicePrimaryCtxRelease_v2(0)), SUCCESS);
});
