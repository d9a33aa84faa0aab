//! Multicast objects: bookkeeping, bindings, a mappable and shareable backing, error codes.

use cuda_abi::{CUmulticastObjectProp, CUresult};

use super::*;
use crate::exports as x;

const INVALID: CUresult = CUresult::ERROR_INVALID_VALUE;

fn mc_prop(devices: u32, size: usize) -> CUmulticastObjectProp {
    CUmulticastObjectProp {
        numDevices: devices,
        size,
        handleTypes: u64::from(POSIX),
        flags: 0,
    }
}

fn mc_create(p: &CUmulticastObjectProp) -> Result<u64, CUresult> {
    let mut h = 0;
    ck(cu!(x::cuMulticastCreate(&mut h, p)))?;
    Ok(h)
}

isolated_test!(
    multicast_objects_bind_map_and_share,
    &[("FAKE_CUDA_DEVICES", "3")],
    {
        init_ctx(0);
        let me = std::process::id() as i32;
        let p = mc_prop(2, 2 * GRAN);
        let mut g = 0;
        assert_eq!(cu!(x::cuMulticastGetGranularity(&mut g, &p, 0)), SUCCESS);
        assert_eq!(g, GRAN);
        assert_eq!(cu!(x::cuMulticastGetGranularity(&mut g, &p, 2)), INVALID);
        assert_eq!(mc_create(&mc_prop(0, GRAN)), Err(INVALID));
        assert_eq!(
            mc_create(&mc_prop(4, GRAN)),
            Err(INVALID),
            "more devices than exist"
        );
        assert_eq!(mc_create(&mc_prop(2, GRAN + 1)), Err(INVALID));
        assert_eq!(
            mc_create(&CUmulticastObjectProp { flags: 1, ..p }),
            Err(INVALID)
        );
        assert_eq!(
            mc_create(&CUmulticastObjectProp {
                handleTypes: 2,
                ..p
            }),
            Err(CUresult::ERROR_NOT_SUPPORTED)
        );
        let mc = mc_create(&p).unwrap();
        assert_eq!(usage(me, -1), 0, "a multicast object is not charged");

        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 0)), SUCCESS);
        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 0)), INVALID, "added twice");
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc, 7)),
            CUresult::ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc + 1000, 1)),
            INVALID,
            "unknown handle"
        );
        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 1)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc, 2)),
            INVALID,
            "beyond numDevices"
        );

        let mem0 = mem_create(2 * GRAN, &prop(0, 0)).unwrap();
        let mem2 = mem_create(GRAN, &prop(2, 0)).unwrap();
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mem0, 1)),
            INVALID,
            "not a multicast handle"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, 2 * GRAN, 0)),
            SUCCESS
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, GRAN, 0)),
            INVALID,
            "overlap"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem2, 0, GRAN, 0)),
            CUresult::ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 4096, mem0, 0, GRAN, 0)),
            INVALID
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, 4 * GRAN, 0)),
            INVALID
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, GRAN, 1)),
            INVALID,
            "flags"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mc, 0, GRAN, 0)),
            INVALID,
            "multicast as memory"
        );

        let (mem1, va1) = vmm_buffer(GRAN, 1, 0);
        assert_eq!(cu!(x::cuMulticastBindAddr(mc, GRAN, va1, GRAN, 0)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastBindAddr(
                mc,
                0,
                va1 + 3 * GRAN as u64,
                GRAN,
                0
            )),
            INVALID
        );

        // The multicast object maps like an allocation and can be exported.
        let va = reserve(2 * GRAN, 0, 0).unwrap();
        assert_eq!(map(va, 2 * GRAN, 0, mc), SUCCESS);
        assert_eq!(set_access(va, 2 * GRAN, &[(0, RW)]), SUCCESS);
        assert_eq!(write(va + 5, b"multi"), SUCCESS);
        assert_eq!(read(va + 5, 5).unwrap(), b"multi");
        let fd = export_fd(mc).unwrap();
        let imported = import_fd(fd).unwrap();
        assert_eq!(
            cu!(x::cuMulticastAddDevice(imported, 2)),
            INVALID,
            "the team is the object's, seen through every handle: already complete"
        );
        assert_eq!(release(imported), SUCCESS);
        let mut ap = cuda_abi::CUmemAllocationProp::default();
        assert_eq!(
            cu!(x::cuMemGetAllocationPropertiesFromHandle(&mut ap, mc)),
            INVALID
        );

        assert_eq!(cu!(x::cuMulticastUnbind(mc, 1, GRAN, GRAN)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastUnbind(mc, 1, GRAN, GRAN)),
            INVALID,
            "unbound twice"
        );
        assert_eq!(
            cu!(x::cuMulticastUnbind(mc, 9, 0, GRAN)),
            CUresult::ERROR_INVALID_DEVICE
        );
        // A bound allocation outlives its handle until the multicast object goes.
        assert_eq!(release(mem0), SUCCESS);
        assert_eq!(usage(me, 0), (2 * GRAN) as u64);
        assert_eq!(unmap(va, 2 * GRAN), SUCCESS);
        assert_eq!(release(mc), SUCCESS);
        assert_eq!(usage(me, 0), 0, "freed with the multicast object");
        assert_eq!(release(mem1), SUCCESS);
        assert_eq!(release(mem2), SUCCESS);
        // SAFETY: our own exported descriptor.
        unsafe { libc::close(fd) };
    }
);

isolated_test!(
    multicast_can_be_disabled,
    &[("FAKE_CUDA_MULTICAST", "0")],
    {
        init_ctx(0);
        let p = mc_prop(1, GRAN);
        let mut g = 0;
        assert_eq!(
            cu!(x::cuMulticastGetGranularity(&mut g, &p, 0)),
            CUresult::ERROR_NOT_SUPPORTED
        );
        assert_eq!(mc_create(&p), Err(CUresult::ERROR_NOT_SUPPORTED));
    }
);
