//! Allocation handles by whose they are, and the application's opaque pointers.

use core::ffi::c_void;
use core::fmt;

/// An allocation handle as the application sees it: the shim hands these out instead of the
/// driver's. Never passed to the driver (no [`crate::safe`] method takes one).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct VirtualHandle(pub u64);

/// An allocation handle of the driver. The application never sees one under the shim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DriverHandle(u64);

impl DriverHandle {
    /// The driver's handle value `raw`, as the driver (or a driver-side test) returned it.
    pub fn from_raw(raw: u64) -> DriverHandle {
        DriverHandle(raw)
    }

    /// The value to pass to the driver.
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for VirtualHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VirtualHandle({:#x})", self.0)
    }
}

impl fmt::Debug for DriverHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DriverHandle({:#x})", self.0)
    }
}

/// A pointer of the application's that the shim hands to the driver unchanged and never reads
/// itself: the out-argument of an export of a handle type the shim does not track, or the OS
/// handle of such an import. Made only by the FFI layer, which vouches for it.
#[derive(Debug, Clone, Copy)]
pub struct ForeignPtr(*mut c_void);

impl ForeignPtr {
    /// Wraps an application pointer for the one driver call it was given for.
    ///
    /// # Safety
    /// `ptr` satisfies the contract of the driver call it is passed to (it came from the
    /// application's arguments of that very call).
    pub unsafe fn new(ptr: *mut c_void) -> ForeignPtr {
        ForeignPtr(ptr)
    }

    pub(crate) fn get(self) -> *mut c_void {
        self.0
    }
}
