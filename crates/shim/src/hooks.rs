//! The FFI boundary: the hook of every wrapped entry point, with the driver's C arguments.
//!
//! Most hooks are generated: each `wrapped` entry of the driver table
//! (`crates/cuda/src/driver_table.rs`) names its pattern in `#[hook(..)]`, and [`hook!`] expands it
//! into the body of the entry's exported wrapper (`table.rs`), so that the C signature is written
//! only in the table. A tracked pattern dispatches (no runtime: the driver's own function; a forked
//! child: refused), reads the application's input pointers, calls the runtime's tracked call with
//! Rust values, and writes what it returns through the application's out-pointer, only on success.
//! The functions after the patterns are the hooks written by hand (`by_hand` in the table): the
//! entries that do more than a pattern says.
//!
//! A null pointer the runtime would need is never read: such a call goes to the driver unchanged
//! (which reports it with its own code) and nothing is recorded, as the driver did nothing.

#![allow(unsafe_code)] // reads and writes the application's pointers
#![allow(non_snake_case)] // hooks carry the driver's symbol names

use core::ffi::{c_int, c_uint, c_ulonglong, c_void};
use cuda::{DriverTable, ForeignPtr, VirtualHandle};
use cuda_abi::{
    CUdeviceptr, CUmemAllocationProp, CUmemGenericAllocationHandle, CUresult, handle_type,
};
use shim_runtime::instance::{Active, active};
use shim_runtime::owned_alloc::PointerValue;
use shim_runtime::runtime::Runtime;
use shim_runtime::track::{ExportTo, Tracked};
use std::os::fd::{BorrowedFd, IntoRawFd};

/// Dispatch: the runtime's tracked call, the driver (no runtime), or a refusal (forked child).
/// Paths are absolute: [`hook!`] expands it inside `table.rs`.
macro_rules! dispatch {
    ($real:ident . $pfn:ident ( $($arg:expr),* ), |$rt:ident| $tracked:expr) => {
        match shim_runtime::instance::active() {
            shim_runtime::instance::Active::Running($rt) => $tracked,
            // SAFETY: the caller's arguments, unchanged, under the caller's contract.
            shim_runtime::instance::Active::Off => unsafe { ($real.$pfn)($($arg),*) },
            shim_runtime::instance::Active::Forked => cuda_abi::CUresult::ERROR_NOT_INITIALIZED,
        }
    };
}
pub(crate) use dispatch;

/// The body of the exported wrapper of one `wrapped` entry: `hook!((HOOK) real.NAME(ARGS))`,
/// where HOOK is the entry's `#[hook(..)]` clause (its grammar is at the table) and ARGS are its C
/// argument names. Each pattern's unsafe blocks carry the one invariant that pattern relies on.
macro_rules! hook {
    ((by_hand) $real:ident . $name:ident ( $($a:ident),* )) => {
        // SAFETY: the caller upholds the driver function's contract for these arguments, which is
        // the hand-written hook's contract.
        unsafe { $crate::hooks::$name($real, $($a),*) }
    };
    (
        (rt . $method:ident ( $( $role:ident $(( $($of:ident),* ))? ),* )
            $(-> $out:ident $(( $outp:ident ))?)?)
        $real:ident . $name:ident ( $($a:ident),* )
    ) => {
        $crate::hooks::dispatch!($real.$name($($a),*), |rt| {
            let nulls = [
                $( $crate::hooks::hook!(@null $role $(( $($of),* ))?), )*
                $( $crate::hooks::hook!(@out_ptr $out $(( $outp ))?).is_null(), )?
            ];
            if nulls.contains(&true) {
                // SAFETY: the caller's arguments, unchanged, under the caller's contract; the
                // driver reports the null.
                return unsafe { ($real.$name)($($a),*) };
            }
            let tracked = rt.$method($( $crate::hooks::hook!(@arg $role $(( $($of),* ))?) ),*);
            $crate::hooks::hook!(@finish tracked $(, $out $(( $outp ))?)?)
        })
    };
    (
        (unowned ( $kind:ident , $($bytes:tt)* ) -> $out:ident)
        $real:ident . $name:ident ( $($a:ident),* )
    ) => {{
        // SAFETY: the caller's arguments, unchanged, under the caller's contract.
        let r = unsafe { ($real.$name)($($a),*) };
        $crate::hooks::observe_alloc(r, $out, |rt, base| {
            let bytes = $crate::hooks::hook!(@bytes $($bytes)*);
            rt.note_unowned(shim_runtime::unowned::UnownedKind::$kind, base, bytes)
        })
    }};
    ((unowned_freed ( $dptr:ident )) $real:ident . $name:ident ( $($a:ident),* )) => {
        // SAFETY: the caller's arguments, unchanged, under the caller's contract.
        $crate::hooks::observe_free(unsafe { ($real.$name)($($a),*) }, $dptr)
    };

    // An argument of a tracked call, by its role, after the null checks.
    (@arg handle($x:ident)) => { cuda::VirtualHandle($x) };
    (@arg read($p:ident)) => {
        // SAFETY: non-null (checked) and, by the driver function's contract, a readable struct
        // for the duration of the call.
        unsafe { &*$p }
    };
    (@arg slice($p:ident, $n:ident)) => {
        // SAFETY: non-null (checked) and, by the driver function's contract, `$n` readable
        // structs for the duration of the call.
        unsafe { core::slice::from_raw_parts($p, $n) }
    };
    // A device address in a `void*`: a number, never dereferenced.
    (@arg address($p:ident)) => { $p as usize as cuda_abi::CUdeviceptr };
    (@arg $x:ident) => { $x };
    // Whether an input pointer the runtime would read is null.
    (@null read($p:ident)) => { $p.is_null() };
    (@null slice($p:ident, $n:ident)) => { $p.is_null() };
    (@null handle($x:ident)) => { false };
    (@null address($p:ident)) => { false };
    (@null $x:ident) => { false };
    (@out_ptr handle($p:ident)) => { $p };
    (@out_ptr $p:ident) => { $p };
    // The C result of the tracked call; its value written through the out-pointer on success.
    (@finish $t:ident) => { $crate::hooks::done($t) };
    (@finish $t:ident, handle($p:ident)) => {
        // SAFETY: non-null (checked) and writable by the driver function's contract.
        $crate::hooks::answer($t, |vh: cuda::VirtualHandle| unsafe { $p.write(vh.0) })
    };
    (@finish $t:ident, $p:ident) => {
        // SAFETY: non-null (checked) and writable by the driver function's contract.
        $crate::hooks::answer($t, |value| unsafe { $p.write(value) })
    };
    // The bytes of an allocation the shim does not own.
    (@bytes pitched($pitch:ident, $width:ident, $height:ident)) => {
        // SAFETY: the driver succeeded, so `$pitch` is null or holds the pitch it wrote.
        unsafe { $crate::hooks::pitched_bytes($pitch, $width, $height) }
    };
    (@bytes $bytes:ident) => { $bytes as u64 };
}
pub(crate) use hook;

/// The C result of a tracked call, after `write` stored its value.
pub(crate) fn answer<T>(r: Tracked<T>, write: impl FnOnce(T)) -> CUresult {
    match r {
        Ok(value) => {
            write(value);
            CUresult::SUCCESS
        }
        Err(code) => code,
    }
}

pub(crate) fn done(r: Tracked) -> CUresult {
    answer(r, |()| {})
}

/// Memory the shim does not own: the driver's call, unchanged, then `note` with the allocated base
/// when it succeeded and the runtime runs (a forked child's calls go to the driver too: there is no
/// tracked state of its own to keep).
pub(crate) fn observe_alloc(
    r: CUresult,
    dptr: *mut CUdeviceptr,
    note: impl FnOnce(&Runtime, CUdeviceptr),
) -> CUresult {
    if r.is_success()
        && !dptr.is_null()
        && let Active::Running(rt) = active()
    {
        // SAFETY: the driver wrote the allocation's base through this non-null pointer.
        note(rt, unsafe { dptr.read() });
    }
    r
}

/// A free of memory the shim does not own, forgotten when the driver's call succeeded.
pub(crate) fn observe_free(r: CUresult, dptr: CUdeviceptr) -> CUresult {
    if r.is_success()
        && let Active::Running(rt) = active()
    {
        rt.note_unowned_freed(dptr);
    }
    r
}

/// The bytes of a pitched allocation: the pitch the driver wrote times the rows.
///
/// # Safety
/// `pitch` is null or holds the pitch a successful `cuMemAllocPitch` wrote.
pub(crate) unsafe fn pitched_bytes(pitch: *const usize, width: usize, height: usize) -> u64 {
    // The driver refuses a null pitch pointer, so a success has one; counted as unpadded rows
    // if not.
    let pitch = if pitch.is_null() {
        width
    } else {
        // SAFETY: non-null, and the driver wrote the pitch through it (the caller's contract).
        unsafe { pitch.read() }
    };
    (pitch as u64).saturating_mul(height as u64)
}

pub(crate) unsafe fn cuInit(real: &'static DriverTable, flags: c_uint) -> CUresult {
    // SAFETY: no pointers.
    let r = unsafe { (real.cuInit)(flags) };
    if r.is_success() {
        crate::process::register_fork_handler();
        if shim_runtime::instance::start_after_init(real) {
            crate::process::register_socket_removal();
        }
    }
    r
}

pub(crate) unsafe fn cuMemGetAllocationPropertiesFromHandle(
    real: &'static DriverTable,
    prop: *mut CUmemAllocationProp,
    handle: CUmemGenericAllocationHandle,
) -> CUresult {
    dispatch!(
        real.cuMemGetAllocationPropertiesFromHandle(prop, handle),
        |rt| {
            if prop.is_null() {
                // The handle is the application's virtual one: translate it, let the driver report.
                return match rt.driver_handle(VirtualHandle(handle)) {
                    // SAFETY: the caller's out-pointer with the driver's handle.
                    Some(h) => unsafe {
                        (real.cuMemGetAllocationPropertiesFromHandle)(prop, h.raw())
                    },
                    None => CUresult::ERROR_INVALID_VALUE,
                };
            }
            answer(rt.mem_get_props(VirtualHandle(handle)), |p| {
                // SAFETY: non-null and writable (the driver's contract).
                unsafe { prop.write(p) }
            })
        }
    )
}

pub(crate) unsafe fn cuMemExportToShareableHandle(
    real: &'static DriverTable,
    shareable: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handle_type: u32,
    flags: c_ulonglong,
) -> CUresult {
    dispatch!(
        real.cuMemExportToShareableHandle(shareable, handle, handle_type, flags),
        |rt| {
            let to = if handle_type == handle_type::POSIX_FILE_DESCRIPTOR && !shareable.is_null() {
                ExportTo::Descriptor
            } else {
                // SAFETY: the application's out-argument of this very call.
                ExportTo::Foreign(unsafe { ForeignPtr::new(shareable) })
            };
            answer(
                rt.mem_export(VirtualHandle(handle), handle_type, flags, to),
                |fd| {
                    if let Some(fd) = fd {
                        // SAFETY: a POSIX export's out-argument is a writable `int`, checked non-null.
                        unsafe { shareable.cast::<c_int>().write(fd.into_raw_fd()) }
                    }
                },
            )
        }
    )
}

pub(crate) unsafe fn cuMemImportFromShareableHandle(
    real: &'static DriverTable,
    handle: *mut CUmemGenericAllocationHandle,
    os_handle: *mut c_void,
    handle_type: u32,
) -> CUresult {
    dispatch!(
        real.cuMemImportFromShareableHandle(handle, os_handle, handle_type),
        |rt| {
            if handle.is_null() {
                // SAFETY: as the caller gave them; the driver reports the null.
                return unsafe {
                    (real.cuMemImportFromShareableHandle)(handle, os_handle, handle_type)
                };
            }
            // For POSIX descriptors the OS handle is the descriptor's number.
            let fd = i32::try_from(os_handle as usize).ok().filter(|fd| *fd >= 0);
            let imported = match fd {
                Some(fd) if handle_type == handle_type::POSIX_FILE_DESCRIPTOR => {
                    // SAFETY: only borrowed for syscalls that report a closed descriptor as EBADF and
                    // for the driver's import; it is the application's and is never closed here.
                    rt.mem_import_fd(unsafe { BorrowedFd::borrow_raw(fd) })
                }
                // Other handle types (FABRIC...), or arguments the driver will refuse.
                // SAFETY: the application's OS handle of this very call.
                _ => rt.mem_import_other(unsafe { ForeignPtr::new(os_handle) }, handle_type),
            };
            // SAFETY: non-null and writable (the driver's contract).
            answer(imported, |vh| unsafe { handle.write(vh.0) })
        }
    )
}

pub(crate) unsafe fn cuMemGetAddressRange_v2(
    real: &'static DriverTable,
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuMemGetAddressRange_v2(base, size, dptr), |rt| {
        // Either out-pointer may be null (the driver then skips it).
        answer(rt.mem_address_range(dptr), |(b, s)| {
            // SAFETY: each is null or writable (the driver's contract).
            if let Some(out) = unsafe { base.as_mut() } {
                *out = b;
            }
            // SAFETY: as above.
            if let Some(out) = unsafe { size.as_mut() } {
                *out = s;
            }
        })
    })
}

/// Writes the shim's answer for one pointer attribute over the driver's.
///
/// # Safety
/// `data` is non-null and the driver just wrote this attribute's value there.
unsafe fn write_pointer_value(data: *mut c_void, value: PointerValue) {
    let bytes: &[u8] = match &value {
        PointerValue::Address(a) => &a.to_ne_bytes(),
        PointerValue::Size(s) => &s.to_ne_bytes(),
        PointerValue::True => &[1],
    };
    // SAFETY: the driver's out-pointer for an attribute of this width (8 bytes for an address or
    // a size; at least one for a boolean), which it wrote.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr(), data.cast::<u8>(), bytes.len()) };
}

pub(crate) unsafe fn cuPointerGetAttribute(
    real: &'static DriverTable,
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    dispatch!(real.cuPointerGetAttribute(data, attribute, ptr), |rt| {
        // The driver answers first (every attribute, with its own width and errors); the shim
        // corrects only what VMM answers differently from cuMemAlloc memory.
        // SAFETY: the caller's arguments, unchanged, under the caller's contract.
        let r = unsafe { (real.cuPointerGetAttribute)(data, attribute, ptr) };
        if r.is_success()
            && !data.is_null()
            && let Some(value) = rt.pointer_attribute(ptr, attribute)
        {
            // SAFETY: the driver succeeded, so `data` holds this attribute's value.
            unsafe { write_pointer_value(data, value) };
        }
        r
    })
}

pub(crate) unsafe fn cuPointerGetAttributes(
    real: &'static DriverTable,
    count: c_uint,
    attributes: *mut c_uint,
    data: *mut *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    dispatch!(
        real.cuPointerGetAttributes(count, attributes, data, ptr),
        |rt| {
            // SAFETY: the caller's arguments, unchanged, under the caller's contract.
            let r = unsafe { (real.cuPointerGetAttributes)(count, attributes, data, ptr) };
            if r.is_success() && !attributes.is_null() && !data.is_null() {
                let count = count as usize;
                // SAFETY: the driver's contract: `count` attributes, which it just read.
                let attributes = unsafe { core::slice::from_raw_parts(attributes, count) };
                // SAFETY: as above, `count` slots.
                let slots = unsafe { core::slice::from_raw_parts(data, count) };
                for (attribute, slot) in attributes.iter().zip(slots) {
                    if let (false, Some(value)) =
                        (slot.is_null(), rt.pointer_attribute(ptr, *attribute))
                    {
                        // SAFETY: the driver succeeded and filled every non-null slot.
                        unsafe { write_pointer_value(*slot, value) };
                    }
                }
            }
            r
        }
    )
}
