//! The error probes: a fixed list of bad VMM (and legacy IPC) calls, each set up on valid objects,
//! made once, and torn down, so that the driver's result code for every error path can be compared
//! between the fake driver and the real one (and with and without the shim). Test tooling only:
//! they run in a process of their own, `cuinterpose-probe-errors` ([`PROGRAM`], built from
//! `src/bin/`), which the `vmm-errors` scenario starts ([`run_process`]) as it starts workloads;
//! the shipped workload has none of them.
//!
//! No probe copies to or from a bad address: on a real GPU a faulting copy could leave a sticky
//! error in the context and spoil every later probe.

#![allow(unsafe_code)] // bad arguments go through raw driver entry points on purpose

use core::ffi::c_void;
use core::ptr;

use cuda_abi::*;
use serde_json::{Value, json};

use std::fs::File;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use workload::driver::{self, Api, CuError, Driver};
use workload::launch::{LaunchError, io};

use crate::harness::{HarnessError, TestEnv};

/// Context of one probe run.
struct P<'a> {
    d: &'a Driver,
    api: &'a Api,
    dev: i32,
    /// Minimum granularity of a POSIX-capable allocation on `dev`.
    g: u64,
}

/// What a probe returns: the bad call's result, or the setup call that failed.
type R = Result<CUresult, CuError>;

/// A valid mapped allocation, for probes that need one.
struct Mapped {
    handle: u64,
    base: u64,
    size: u64,
}

impl P<'_> {
    fn prop(&self, types: u32) -> CUmemAllocationProp {
        driver::device_prop(self.dev, types)
    }

    fn alloc(&self, size: u64) -> Result<u64, CuError> {
        self.d
            .mem_create(size, &self.prop(handle_type::POSIX_FILE_DESCRIPTOR))
    }

    fn reserve(&self, size: u64) -> Result<u64, CuError> {
        self.d.address_reserve(size, 0, 0)
    }

    fn mapped(&self, size: u64) -> Result<Mapped, CuError> {
        let handle = self.alloc(size)?;
        let base = match self.reserve(size) {
            Ok(b) => b,
            Err(e) => {
                let _ = self.d.mem_release(handle);
                return Err(e);
            }
        };
        let m = Mapped { handle, base, size };
        if let Err(e) = self.d.map(base, size, 0, handle) {
            let _ = self.d.address_free(base, size);
            let _ = self.d.mem_release(handle);
            return Err(e);
        }
        if let Err(e) = self
            .d
            .set_access(base, size, &[self.access(access_flags::PROT_READWRITE)])
        {
            self.drop_mapped(m);
            return Err(e);
        }
        Ok(m)
    }

    fn drop_mapped(&self, m: Mapped) {
        let _ = self.d.unmap(m.base, m.size);
        let _ = self.d.address_free(m.base, m.size);
        let _ = self.d.mem_release(m.handle);
    }

    fn access(&self, flags: u32) -> CUmemAccessDesc {
        CUmemAccessDesc {
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: self.dev,
            },
            flags,
        }
    }

    /// `cuMemCreate` with `prop`, releasing whatever it might create.
    fn create_with(&self, size: u64, prop: &CUmemAllocationProp, flags: u64) -> CUresult {
        let mut h = 0u64;
        // SAFETY: valid out-pointer and property struct; bad values are the probe.
        let r = unsafe { (self.api.cuMemCreate)(&mut h, size as usize, prop, flags) };
        if r.is_success() {
            let _ = self.d.mem_release(h);
        }
        r
    }

    /// `cuMemAddressReserve`, freeing whatever it might reserve.
    fn reserve_with(&self, size: u64, align: u64, flags: u64) -> CUresult {
        let mut p = 0u64;
        // SAFETY: valid out-pointer; bad values are the probe.
        let r = unsafe {
            (self.api.cuMemAddressReserve)(&mut p, size as usize, align as usize, 0, flags)
        };
        if r.is_success() {
            let _ = self.d.address_free(p, size);
        }
        r
    }

    /// `cuMemMap`, unmapping whatever it might map.
    fn map_with(&self, base: u64, size: u64, offset: u64, h: u64, flags: u64) -> CUresult {
        // SAFETY: values only; bad values are the probe.
        let r = unsafe { (self.api.cuMemMap)(base, size as usize, offset as usize, h, flags) };
        if r.is_success() {
            let _ = self.d.unmap(base, size);
        }
        r
    }

    /// `cuMemExportToShareableHandle`, closing whatever descriptor it might produce.
    fn export_with(&self, h: u64, kind: u32, flags: u64) -> CUresult {
        let mut out = [0u8; 64];
        // SAFETY: 64 bytes hold either an `int` or a `CUmemFabricHandle`.
        let r = unsafe {
            (self.api.cuMemExportToShareableHandle)(out.as_mut_ptr().cast(), h, kind, flags)
        };
        if r.is_success() && kind == handle_type::POSIX_FILE_DESCRIPTOR {
            let fd = i32::from_ne_bytes([out[0], out[1], out[2], out[3]]);
            if fd >= 0 {
                // SAFETY: the driver just gave us this descriptor and nothing else owns it.
                drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
        }
        r
    }
}

/// One probe: its name, the entry point it calls with bad arguments, and the probe.
#[derive(Debug)]
pub struct Probe {
    /// `area.what`, stable across versions (the GPU lane compares by it).
    pub name: &'static str,
    /// The driver entry point under test.
    pub call: &'static str,
    run: fn(&P) -> R,
}

/// Every probe, in the order they run.
pub static PROBES: &[Probe] = &[
    Probe {
        name: "create.size-zero",
        call: "cuMemCreate",
        run: |p| Ok(p.create_with(0, &p.prop(handle_type::POSIX_FILE_DESCRIPTOR), 0)),
    },
    Probe {
        name: "create.size-unaligned",
        call: "cuMemCreate",
        run: |p| Ok(p.create_with(p.g / 2, &p.prop(handle_type::POSIX_FILE_DESCRIPTOR), 0)),
    },
    Probe {
        name: "create.null-handle",
        call: "cuMemCreate",
        run: |p| {
            let prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            Ok(unsafe { (p.api.cuMemCreate)(ptr::null_mut(), p.g as usize, &prop, 0) })
        },
    },
    Probe {
        name: "create.null-prop",
        call: "cuMemCreate",
        run: |p| {
            let mut h = 0u64;
            // SAFETY: the driver must refuse a null property pointer; that is what is probed.
            let r = unsafe { (p.api.cuMemCreate)(&mut h, p.g as usize, ptr::null(), 0) };
            if r.is_success() {
                let _ = p.d.mem_release(h);
            }
            Ok(r)
        },
    },
    Probe {
        name: "create.bad-device",
        call: "cuMemCreate",
        run: |p| {
            let mut prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            prop.location.id = 9999;
            Ok(p.create_with(p.g, &prop, 0))
        },
    },
    Probe {
        name: "create.bad-location-type",
        call: "cuMemCreate",
        run: |p| {
            let mut prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            prop.location.type_ = location_type::INVALID;
            Ok(p.create_with(p.g, &prop, 0))
        },
    },
    Probe {
        name: "create.bad-allocation-type",
        call: "cuMemCreate",
        run: |p| {
            let mut prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            prop.type_ = allocation_type::INVALID;
            Ok(p.create_with(p.g, &prop, 0))
        },
    },
    Probe {
        name: "create.nonzero-flags",
        call: "cuMemCreate",
        run: |p| Ok(p.create_with(p.g, &p.prop(handle_type::POSIX_FILE_DESCRIPTOR), 1)),
    },
    Probe {
        name: "create.too-large",
        call: "cuMemCreate",
        run: |p| {
            let size = (1u64 << 40).div_ceil(p.g.max(1)) * p.g.max(1);
            Ok(p.create_with(size, &p.prop(handle_type::POSIX_FILE_DESCRIPTOR), 0))
        },
    },
    Probe {
        name: "release.zero-handle",
        call: "cuMemRelease",
        run: |p| {
            // SAFETY: a handle value only.
            Ok(unsafe { (p.api.cuMemRelease)(0) })
        },
    },
    Probe {
        name: "release.twice",
        call: "cuMemRelease",
        run: |p| {
            let h = p.alloc(p.g)?;
            p.d.mem_release(h)?;
            // SAFETY: a handle value only.
            Ok(unsafe { (p.api.cuMemRelease)(h) })
        },
    },
    Probe {
        name: "reserve.size-zero",
        call: "cuMemAddressReserve",
        run: |p| Ok(p.reserve_with(0, 0, 0)),
    },
    Probe {
        name: "reserve.size-unaligned",
        call: "cuMemAddressReserve",
        run: |p| Ok(p.reserve_with(p.g / 2, 0, 0)),
    },
    Probe {
        name: "reserve.null-ptr",
        call: "cuMemAddressReserve",
        run: |p| {
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            Ok(unsafe { (p.api.cuMemAddressReserve)(ptr::null_mut(), p.g as usize, 0, 0, 0) })
        },
    },
    Probe {
        name: "reserve.alignment-not-power-of-two",
        call: "cuMemAddressReserve",
        run: |p| Ok(p.reserve_with(p.g * 3, p.g * 3, 0)),
    },
    Probe {
        name: "reserve.nonzero-flags",
        call: "cuMemAddressReserve",
        run: |p| Ok(p.reserve_with(p.g, 0, 1)),
    },
    Probe {
        name: "address-free.twice",
        call: "cuMemAddressFree",
        run: |p| {
            let base = p.reserve(p.g)?;
            p.d.address_free(base, p.g)?;
            // SAFETY: values only.
            Ok(unsafe { (p.api.cuMemAddressFree)(base, p.g as usize) })
        },
    },
    Probe {
        name: "address-free.partial",
        call: "cuMemAddressFree",
        run: |p| {
            let base = p.reserve(2 * p.g)?;
            // SAFETY: values only.
            let r = unsafe { (p.api.cuMemAddressFree)(base, p.g as usize) };
            if r.is_success() {
                let _ = p.d.address_free(base + p.g, p.g);
            } else {
                let _ = p.d.address_free(base, 2 * p.g);
            }
            Ok(r)
        },
    },
    Probe {
        name: "map.unreserved-address",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(p.g)?;
            p.d.address_free(base, p.g)?;
            let r = p.map_with(base, p.g, 0, h, 0);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.offset-unaligned",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(2 * p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g, p.g / 2, h, 0);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.size-unaligned",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g / 2, 0, h, 0);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.size-zero",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, 0, 0, h, 0);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.beyond-allocation",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(2 * p.g)?;
            let r = p.map_with(base, 2 * p.g, 0, h, 0);
            let _ = p.d.address_free(base, 2 * p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.offset-beyond-allocation",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g, p.g, h, 0);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.beyond-reservation",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(2 * p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, 2 * p.g, 0, h, 0);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "map.already-mapped",
        call: "cuMemMap",
        run: |p| {
            let m = p.mapped(p.g)?;
            let h2 = match p.alloc(p.g) {
                Ok(h) => h,
                Err(e) => {
                    p.drop_mapped(m);
                    return Err(e);
                }
            };
            // SAFETY: values only. Not `map_with`: on success it would unmap the first mapping too.
            let r = unsafe { (p.api.cuMemMap)(m.base, m.size as usize, 0, h2, 0) };
            p.drop_mapped(m);
            let _ = p.d.mem_release(h2);
            Ok(r)
        },
    },
    Probe {
        name: "map.released-handle",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            p.d.mem_release(h)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g, 0, h, 0);
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "map.zero-handle",
        call: "cuMemMap",
        run: |p| {
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g, 0, 0, 0);
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "map.nonzero-flags",
        call: "cuMemMap",
        run: |p| {
            let h = p.alloc(p.g)?;
            let base = p.reserve(p.g)?;
            let r = p.map_with(base, p.g, 0, h, 1);
            let _ = p.d.address_free(base, p.g);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "unmap.not-mapped",
        call: "cuMemUnmap",
        run: |p| {
            let base = p.reserve(p.g)?;
            // SAFETY: values only.
            let r = unsafe { (p.api.cuMemUnmap)(base, p.g as usize) };
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "unmap.partial",
        call: "cuMemUnmap",
        run: |p| {
            let m = p.mapped(2 * p.g)?;
            // SAFETY: values only.
            let r = unsafe { (p.api.cuMemUnmap)(m.base, p.g as usize) };
            if r.is_success() {
                let _ = p.d.unmap(m.base + p.g, p.g);
            }
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.not-mapped",
        call: "cuMemSetAccess",
        run: |p| {
            let base = p.reserve(p.g)?;
            let desc = p.access(access_flags::PROT_READWRITE);
            // SAFETY: one valid descriptor.
            let r = unsafe { (p.api.cuMemSetAccess)(base, p.g as usize, &desc, 1) };
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.null-desc",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            // SAFETY: the driver must refuse a null descriptor array; that is what is probed.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, m.size as usize, ptr::null(), 1) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.zero-count",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let desc = p.access(access_flags::PROT_READWRITE);
            // SAFETY: a valid descriptor array with count 0.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, m.size as usize, &desc, 0) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.bad-device",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let mut desc = p.access(access_flags::PROT_READWRITE);
            desc.location.id = 9999;
            // SAFETY: one descriptor.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, m.size as usize, &desc, 1) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.bad-location-type",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let mut desc = p.access(access_flags::PROT_READWRITE);
            desc.location.type_ = location_type::INVALID;
            // SAFETY: one descriptor.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, m.size as usize, &desc, 1) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.bad-flags",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let desc = p.access(2);
            // SAFETY: one descriptor.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, m.size as usize, &desc, 1) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "set-access.size-unaligned",
        call: "cuMemSetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let desc = p.access(access_flags::PROT_READWRITE);
            // SAFETY: one descriptor.
            let r = unsafe { (p.api.cuMemSetAccess)(m.base, (m.size / 2) as usize, &desc, 1) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "get-access.not-mapped",
        call: "cuMemGetAccess",
        run: |p| {
            let base = p.reserve(p.g)?;
            let loc = p.access(0).location;
            let mut flags = 0u64;
            // SAFETY: valid out-pointer and location.
            let r = unsafe { (p.api.cuMemGetAccess)(&mut flags, &loc, base) };
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "get-access.null-flags",
        call: "cuMemGetAccess",
        run: |p| {
            let m = p.mapped(p.g)?;
            let loc = p.access(0).location;
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            let r = unsafe { (p.api.cuMemGetAccess)(ptr::null_mut(), &loc, m.base) };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "export.type-not-requested",
        call: "cuMemExportToShareableHandle",
        run: |p| {
            let h = p.d.mem_create(p.g, &p.prop(handle_type::NONE))?;
            let r = p.export_with(h, handle_type::POSIX_FILE_DESCRIPTOR, 0);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "export.fabric-not-requested",
        call: "cuMemExportToShareableHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            let r = p.export_with(h, handle_type::FABRIC, 0);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "export.null-out",
        call: "cuMemExportToShareableHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            let r = unsafe {
                (p.api.cuMemExportToShareableHandle)(
                    ptr::null_mut(),
                    h,
                    handle_type::POSIX_FILE_DESCRIPTOR,
                    0,
                )
            };
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "export.zero-handle",
        call: "cuMemExportToShareableHandle",
        run: |p| Ok(p.export_with(0, handle_type::POSIX_FILE_DESCRIPTOR, 0)),
    },
    Probe {
        name: "export.released-handle",
        call: "cuMemExportToShareableHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            p.d.mem_release(h)?;
            Ok(p.export_with(h, handle_type::POSIX_FILE_DESCRIPTOR, 0))
        },
    },
    Probe {
        name: "import.negative-fd",
        call: "cuMemImportFromShareableHandle",
        run: |p| Ok(import_result(p, p.d.import_raw_fd(-1))),
    },
    Probe {
        name: "import.unopened-fd",
        call: "cuMemImportFromShareableHandle",
        run: |p| {
            // Far above any descriptor this process opens (the default soft limit is 1024).
            Ok(import_result(p, p.d.import_raw_fd(1 << 20)))
        },
    },
    Probe {
        name: "import.not-a-cuda-fd",
        call: "cuMemImportFromShareableHandle",
        run: |p| match std::fs::File::open("/dev/null") {
            Ok(f) => {
                use std::os::fd::AsFd;
                Ok(import_result(p, p.d.import_fd(f.as_fd())))
            }
            Err(_) => Err(CuError {
                call: "open(/dev/null)",
                result: CUresult::ERROR_UNKNOWN,
            }),
        },
    },
    Probe {
        name: "import.null-out",
        call: "cuMemImportFromShareableHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            let fd = match p.d.export_fd(h) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = p.d.mem_release(h);
                    return Err(e);
                }
            };
            use std::os::fd::AsRawFd;
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            let r = unsafe {
                (p.api.cuMemImportFromShareableHandle)(
                    ptr::null_mut(),
                    fd.as_raw_fd() as isize as *mut c_void,
                    handle_type::POSIX_FILE_DESCRIPTOR,
                )
            };
            drop(fd);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "import.bad-handle-type",
        call: "cuMemImportFromShareableHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            let fd = match p.d.export_fd(h) {
                Ok(fd) => fd,
                Err(e) => {
                    let _ = p.d.mem_release(h);
                    return Err(e);
                }
            };
            use std::os::fd::AsRawFd;
            let mut out = 0u64;
            // SAFETY: valid out-pointer; handle type 0 is the probe.
            let r = unsafe {
                (p.api.cuMemImportFromShareableHandle)(
                    &mut out,
                    fd.as_raw_fd() as isize as *mut c_void,
                    handle_type::NONE,
                )
            };
            if r.is_success() {
                let _ = p.d.mem_release(out);
            }
            drop(fd);
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "retain.not-mapped",
        call: "cuMemRetainAllocationHandle",
        run: |p| {
            let base = p.reserve(p.g)?;
            let r = match p.d.retain(base) {
                Ok(h) => {
                    let _ = p.d.mem_release(h);
                    CUresult::SUCCESS
                }
                Err(e) => e.result,
            };
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "retain.null-out",
        call: "cuMemRetainAllocationHandle",
        run: |p| {
            let m = p.mapped(p.g)?;
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            let r = unsafe {
                (p.api.cuMemRetainAllocationHandle)(ptr::null_mut(), m.base as usize as *mut c_void)
            };
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "get-props.zero-handle",
        call: "cuMemGetAllocationPropertiesFromHandle",
        run: |p| {
            Ok(p.d
                .properties(0)
                .err()
                .map_or(CUresult::SUCCESS, |e| e.result))
        },
    },
    Probe {
        name: "get-props.released-handle",
        call: "cuMemGetAllocationPropertiesFromHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            p.d.mem_release(h)?;
            Ok(p.d
                .properties(h)
                .err()
                .map_or(CUresult::SUCCESS, |e| e.result))
        },
    },
    Probe {
        name: "get-props.null-out",
        call: "cuMemGetAllocationPropertiesFromHandle",
        run: |p| {
            let h = p.alloc(p.g)?;
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            let r = unsafe { (p.api.cuMemGetAllocationPropertiesFromHandle)(ptr::null_mut(), h) };
            let _ = p.d.mem_release(h);
            Ok(r)
        },
    },
    Probe {
        name: "granularity.null-prop",
        call: "cuMemGetAllocationGranularity",
        run: |p| {
            let mut g = 0usize;
            // SAFETY: the driver must refuse a null property pointer; that is what is probed.
            Ok(unsafe { (p.api.cuMemGetAllocationGranularity)(&mut g, ptr::null(), 0) })
        },
    },
    Probe {
        name: "granularity.null-out",
        call: "cuMemGetAllocationGranularity",
        run: |p| {
            let prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            // SAFETY: the driver must refuse a null out-pointer; that is what is probed.
            Ok(unsafe { (p.api.cuMemGetAllocationGranularity)(ptr::null_mut(), &prop, 0) })
        },
    },
    Probe {
        name: "granularity.bad-option",
        call: "cuMemGetAllocationGranularity",
        run: |p| {
            let prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            Ok(p.d
                .granularity(&prop, 7)
                .err()
                .map_or(CUresult::SUCCESS, |e| e.result))
        },
    },
    Probe {
        name: "granularity.bad-device",
        call: "cuMemGetAllocationGranularity",
        run: |p| {
            let mut prop = p.prop(handle_type::POSIX_FILE_DESCRIPTOR);
            prop.location.id = 9999;
            Ok(p.d
                .granularity(&prop, 0)
                .err()
                .map_or(CUresult::SUCCESS, |e| e.result))
        },
    },
    Probe {
        name: "malloc.size-zero",
        call: "cuMemAlloc_v2",
        run: |p| {
            Ok(match p.d.malloc(0) {
                Ok(ptr) => {
                    let _ = p.d.free(ptr);
                    CUresult::SUCCESS
                }
                Err(e) => e.result,
            })
        },
    },
    Probe {
        name: "free.reserved-not-allocated",
        call: "cuMemFree_v2",
        run: |p| {
            let base = p.reserve(p.g)?;
            let r = p.d.free(base).err().map_or(CUresult::SUCCESS, |e| e.result);
            let _ = p.d.address_free(base, p.g);
            Ok(r)
        },
    },
    Probe {
        name: "ipc.get-on-vmm",
        call: "cuIpcGetMemHandle",
        run: |p| {
            let m = p.mapped(p.g)?;
            let r =
                p.d.ipc_get(m.base)
                    .err()
                    .map_or(CUresult::SUCCESS, |e| e.result);
            p.drop_mapped(m);
            Ok(r)
        },
    },
    Probe {
        name: "ipc.open-zero-handle",
        call: "cuIpcOpenMemHandle_v2",
        run: |p| {
            Ok(match p.d.ipc_open(&[0u8; 64]) {
                Ok(ptr) => {
                    let _ = p.d.ipc_close(ptr);
                    CUresult::SUCCESS
                }
                Err(e) => e.result,
            })
        },
    },
    Probe {
        name: "ipc.open-own-handle",
        call: "cuIpcOpenMemHandle_v2",
        run: |p| {
            let ptr = p.d.malloc(p.g)?;
            let r = match p.d.ipc_get(ptr) {
                Ok(bytes) => match p.d.ipc_open(&bytes) {
                    Ok(opened) => {
                        let _ = p.d.ipc_close(opened);
                        CUresult::SUCCESS
                    }
                    Err(e) => e.result,
                },
                Err(e) => {
                    let _ = p.d.free(ptr);
                    return Err(e);
                }
            };
            let _ = p.d.free(ptr);
            Ok(r)
        },
    },
    Probe {
        name: "ipc.close-not-opened",
        call: "cuIpcCloseMemHandle",
        run: |p| {
            let ptr = p.d.malloc(p.g)?;
            let r =
                p.d.ipc_close(ptr)
                    .err()
                    .map_or(CUresult::SUCCESS, |e| e.result);
            let _ = p.d.free(ptr);
            Ok(r)
        },
    },
    // Last: if the driver frees a mapped range, what it leaves behind cannot disturb other probes.
    Probe {
        name: "address-free.while-mapped",
        call: "cuMemAddressFree",
        run: |p| {
            let m = p.mapped(p.g)?;
            // SAFETY: values only.
            let r = unsafe { (p.api.cuMemAddressFree)(m.base, m.size as usize) };
            if r.is_success() {
                let _ = p.d.mem_release(m.handle);
            } else {
                p.drop_mapped(m);
            }
            Ok(r)
        },
    },
];

fn import_result(p: &P, r: Result<u64, CuError>) -> CUresult {
    match r {
        Ok(h) => {
            let _ = p.d.mem_release(h);
            CUresult::SUCCESS
        }
        Err(e) => e.result,
    }
}

/// Runs every probe on `device` except those named in `skip`; one JSON object per probe:
/// `{"case": NAME, "call": ENTRY, "result": "CUDA_ERROR_..."}`, or `"result": "setup:CALL=CODE"`
/// when a valid setup call failed.
///
/// Each probe's name goes to stderr (`probe-errors: running NAME`, flushed) before it runs: a real
/// driver may kill the process on a bad pointer (SIGSEGV), and the scenario reads the last name
/// from the process's log to tell which probe did it, then runs the rest in a fresh process.
pub fn run_all(d: &Driver, device: i32, skip: &[&str]) -> Vec<Value> {
    let prop = driver::device_prop(device, handle_type::POSIX_FILE_DESCRIPTOR);
    let g = d
        .granularity(&prop, granularity_flags::MINIMUM)
        .unwrap_or(2 << 20)
        .max(2);
    let p = P {
        d,
        api: d.api(),
        dev: device,
        g,
    };
    PROBES
        .iter()
        .filter(|probe| !skip.contains(&probe.name))
        .map(|probe| {
            announce(probe.name);
            let result = match (probe.run)(&p) {
                Ok(r) if r.is_success() => "CUDA_SUCCESS".to_owned(),
                Ok(r) => d.error_name(r),
                Err(e) => format!("setup:{}={}", e.call, d.error_name(e.result)),
            };
            json!({"case": probe.name, "call": probe.call, "result": result})
        })
        .collect()
}

/// The stderr line that names the probe about to run.
pub const RUNNING: &str = "probe-errors: running ";

fn announce(name: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    // Nothing to do if stderr is gone: the probe still runs and its result is in the reply.
    let _ = writeln!(err, "{RUNNING}{name}");
    let _ = err.flush();
}

/// The probe a crashed `probe-errors` was running: the last name announced in `log`.
pub fn last_running(log: &str) -> Option<&str> {
    log.lines()
        .rev()
        .find_map(|line| line.strip_prefix(RUNNING))
        .map(str::trim_end)
}

/// The program that runs the probes, beside the workload (`target/<profile>/`, the release's
/// `bin/`): `cuinterpose-probe-errors [--device D] [--skip NAME[,NAME...]]...`, one JSON object
/// `{"cases": [...]}` ([`run_all`]) on stdout, each probe's name on stderr before it runs.
pub const PROGRAM: &str = "cuinterpose-probe-errors";

/// How long one probe process may run, as long as a workload command may.
const PROBE_TIMEOUT: Duration = workload::launch::COMMAND_TIMEOUT;

/// How a probe process ended.
#[derive(Debug)]
pub enum Ended {
    /// It ran the probes it was given: one JSON object per probe ([`run_all`]).
    Answered(Vec<Value>),
    /// It died (a real driver kills it on some bad pointers) or failed: how, and its stderr, whose
    /// last [`RUNNING`] line names the probe it was running.
    Died {
        /// Its exit status.
        status: ExitStatus,
        /// Its stderr.
        log: String,
    },
}

/// Runs every probe but `skip` in a fresh process of `env`, as `env` starts a workload (its driver,
/// its shim setting, device 0, entry points through `dlsym`); stdout and stderr go to
/// `<name>.json` and `<name>.log` in its log directory.
pub fn run_process(env: &TestEnv, name: &str, skip: &[&str]) -> Result<Ended, HarnessError> {
    let program = env.artifacts().dir().join(PROGRAM);
    if !program.exists() {
        let hint = "build first: cargo build --workspace --all-targets";
        return Err(LaunchError::Missing {
            path: program,
            hint,
        }
        .into());
    }
    let file =
        |path: &Path| File::create(path).map_err(io(format!("cannot create {}", path.display())));
    let (out_path, log_path) = (
        env.log_dir().join(format!("{name}.json")),
        env.log_dir().join(format!("{name}.log")),
    );
    let mut cmd = env.command(&program, env.shim())?;
    if !skip.is_empty() {
        cmd.arg("--skip").arg(skip.join(","));
    }
    cmd.stdin(Stdio::null())
        .stdout(file(&out_path)?)
        .stderr(file(&log_path)?);
    let mut child = cmd
        .spawn()
        .map_err(io(format!("cannot start {}", program.display())))?;
    let status = wait(&mut child, PROBE_TIMEOUT)
        .map_err(io(format!("waiting for {} ({name})", program.display())))?;
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    if !status.success() {
        return Ok(Ended::Died { status, log });
    }
    let out = std::fs::read_to_string(&out_path)
        .map_err(io(format!("cannot read {}", out_path.display())))?;
    let cases = serde_json::from_str::<Value>(&out)
        .ok()
        .and_then(|reply| reply.get("cases").and_then(Value::as_array).cloned());
    cases.map(Ended::Answered).ok_or(HarnessError::Probes {
        what: format!("{} ({name}) printed no cases: {out:?}", program.display()),
        log,
    })
}

/// `child`'s exit status; killed (and a `TimedOut` error) if it runs past `timeout`.
fn wait(child: &mut Child, timeout: Duration) -> std::io::Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("still running after {} s, killed", timeout.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_announced_probe_is_found_among_other_lines() {
        let log = format!("start\n{RUNNING}create.size-zero\n{RUNNING}export.null-out\nnoise\n");
        assert_eq!(last_running(&log), Some("export.null-out"));
        assert_eq!(last_running("nothing here\n"), None);
    }

    #[test]
    fn probe_names_are_unique() {
        let mut names: Vec<&str> = PROBES.iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PROBES.len());
    }
}
