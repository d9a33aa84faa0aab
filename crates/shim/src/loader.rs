//! The dynamic loader as the shim uses it: glibc's real `dlsym`, symbol identification with
//! `dladdr`, and finding the driver's own entry points.
//!
//! Everything reachable from the `dlsym` hook ([`real_dlsym`], [`symbol_at`], [`provider`],
//! [`note_driver`]) neither allocates nor locks: an allocator interposer may call `dlsym` from its
//! own initialisation, and Rust's std calls `dlsym` for its weak symbols. Lazily found pointers are
//! published through `AtomicPtr` with an idempotent race (two threads may both look the value up;
//! both get the same answer), never a `Once`: a once-guard would make a second thread wait while
//! the first one is inside the loader, and the loader lock may be held by a thread that is itself
//! waiting for the guard (a library constructor).

#![allow(unsafe_code)] // FFI to the dynamic loader

use core::ffi::{CStr, c_char, c_int, c_void};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicPtr, Ordering};

/// The signature of `dlsym`.
pub(crate) type Dlsym = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's `dlsym`, or null until the first lookup. The trampoline in `dlsym.rs` reads it directly.
pub(crate) static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Finds glibc's `dlsym` (the next definition after this library), publishes and returns it.
/// Called from the trampoline with its argument registers saved, and from [`real_dlsym`].
pub(crate) extern "C" fn resolve_real_dlsym() -> *mut c_void {
    // x86_64 glibc: `dlsym@GLIBC_2.34` since libdl moved into libc, `dlsym@GLIBC_2.2.5` before.
    for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
        // SAFETY: both strings are NUL-terminated; `dlvsym` with RTLD_NEXT only reads the loader's
        // tables and neither allocates nor calls back into this library.
        let found = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
        if !found.is_null() {
            REAL_DLSYM.store(found, Ordering::Release);
            return found;
        }
    }
    // Not glibc: never jump to null; every lookup then fails as an unknown symbol would.
    let unavailable = dlsym_unavailable as Dlsym as *mut c_void;
    REAL_DLSYM.store(unavailable, Ordering::Release);
    unavailable
}

unsafe extern "C" fn dlsym_unavailable(_: *mut c_void, _: *const c_char) -> *mut c_void {
    ptr::null_mut()
}

/// glibc's `dlsym`. Lookups through it with `RTLD_NEXT` are relative to this library.
pub(crate) fn real_dlsym() -> Dlsym {
    let mut found = REAL_DLSYM.load(Ordering::Acquire);
    if found.is_null() {
        found = resolve_real_dlsym();
    }
    // SAFETY: `found` is glibc's `dlsym` or `dlsym_unavailable`, both of type `Dlsym`.
    unsafe { core::mem::transmute::<*mut c_void, Dlsym>(found) }
}

/// Looks `name` up through `handle` with glibc's `dlsym`.
///
/// # Safety
/// `handle` is `RTLD_NEXT`, `RTLD_DEFAULT` or a live handle from `dlopen`.
pub(crate) unsafe fn lookup_in(handle: *mut c_void, name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: the caller vouches for `handle`; `name` is NUL-terminated.
    NonNull::new(unsafe { real_dlsym()(handle, name.as_ptr()) })
}

/// What `dladdr` says about an address. The strings belong to the loader and stay valid while the
/// object is loaded, which covers the short uses here.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SymbolInfo {
    /// Load address of the object holding the address.
    pub(crate) object: *mut c_void,
    /// Path of that object as the loader recorded it (may be empty for the main program).
    file: *const c_char,
    /// The nearest dynamic symbol at or below the address, if any.
    name: *const c_char,
    /// The address of that symbol.
    start: *mut c_void,
}

impl SymbolInfo {
    /// The object's file name as recorded by the loader.
    pub(crate) fn file(&self) -> &[u8] {
        if self.file.is_null() {
            return b"";
        }
        // SAFETY: `dladdr` returned a NUL-terminated loader string, valid while the object is loaded.
        unsafe { CStr::from_ptr(self.file) }.to_bytes()
    }

    /// The symbol's name, if the address is exactly the start of a named dynamic symbol.
    pub(crate) fn exact_name(&self, address: *const c_void) -> Option<&[u8]> {
        if self.name.is_null() || self.start.cast_const() != address {
            return None;
        }
        // SAFETY: as for `file`.
        Some(unsafe { CStr::from_ptr(self.name) }.to_bytes())
    }

    /// The raw path, for handing back to `dlopen`.
    pub(crate) fn file_ptr(&self) -> *const c_char {
        self.file
    }
}

/// `dladdr(address)`: which object and symbol an address belongs to. No allocation.
pub(crate) fn symbol_at(address: *const c_void) -> Option<SymbolInfo> {
    if address.is_null() {
        return None;
    }
    let mut info = libc::Dl_info {
        dli_fname: ptr::null(),
        dli_fbase: ptr::null_mut(),
        dli_sname: ptr::null(),
        dli_saddr: ptr::null_mut(),
    };
    // SAFETY: `dladdr` accepts any address and only writes `info`.
    if unsafe { libc::dladdr(address, &mut info) } == 0 {
        return None;
    }
    Some(SymbolInfo {
        object: info.dli_fbase,
        file: info.dli_fname,
        name: info.dli_sname,
        start: info.dli_saddr,
    })
}

/// Which CUDA library an object is, by the basename of its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provider {
    /// `libcuda.so` or `libcuda.so.*`: the driver (or the fake driver).
    Driver,
    /// `libcudart.so` or `libcudart.so.*`: a dynamic CUDA runtime.
    Runtime,
    /// Anything else, including this library.
    Other,
}

/// Classifies an object path (`/usr/lib/x86_64-linux-gnu/libcuda.so.1` is the driver).
pub(crate) fn provider(file: &[u8]) -> Provider {
    let base = match file.iter().rposition(|&byte| byte == b'/') {
        Some(slash) => file.get(slash + 1..).unwrap_or_default(),
        None => file,
    };
    if is_library(base, b"libcuda.so") {
        Provider::Driver
    } else if is_library(base, b"libcudart.so") {
        Provider::Runtime
    } else {
        Provider::Other
    }
}

/// `base` is `stem` or `stem.<anything>` (so `libcuda.so.1` but not `libcudart.so`).
fn is_library(base: &[u8], stem: &[u8]) -> bool {
    match base.strip_prefix(stem) {
        Some(rest) => rest.is_empty() || rest.first() == Some(&b'.'),
        None => false,
    }
}

/// Publishes `found` in `slot` unless a pointer is there already (the first one seen wins: later
/// lookups find the same object in the ordinary case), and returns the published one.
/// Allocation- and lock-free, so the `dlsym` hook may call it.
pub(crate) fn publish_once(
    slot: &AtomicPtr<c_void>,
    found: *mut c_void,
) -> Option<NonNull<c_void>> {
    match slot.compare_exchange(ptr::null_mut(), found, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => NonNull::new(found),
        Err(published) => NonNull::new(published),
    }
}

/// The pointer published in `slot`, else the one `find` looks up, published ([`publish_once`]):
/// the idempotent race of the module's docs, in one place.
pub(crate) fn found_once(
    slot: &AtomicPtr<c_void>,
    find: impl FnOnce() -> Option<NonNull<c_void>>,
) -> Option<NonNull<c_void>> {
    if let Some(published) = NonNull::new(slot.load(Ordering::Acquire)) {
        return Some(published);
    }
    publish_once(slot, find()?.as_ptr())
}

/// Load address of this library, found once.
static OWN_OBJECT: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Whether `address` lies in this library (one of our own wrappers or resolvers).
pub(crate) fn is_own(address: *const c_void) -> bool {
    let mut own = OWN_OBJECT.load(Ordering::Relaxed);
    if own.is_null() {
        let anchor = is_own as fn(*const c_void) -> bool as *const c_void;
        own = symbol_at(anchor).map_or(ptr::null_mut(), |info| info.object);
        OWN_OBJECT.store(own, Ordering::Relaxed);
    }
    !own.is_null() && symbol_at(address).is_some_and(|info| info.object == own)
}

/// An address inside the driver, as last seen by the `dlsym` hook. It leads to the driver when the
/// application opened it `RTLD_LOCAL` (so `RTLD_NEXT` cannot see it) and under whatever name. An
/// address rather than the application's handle, because the handle dangles if the application
/// closes it, while `dladdr` on a stale address merely finds nothing (or another object, which
/// [`provider`] then rejects).
static DRIVER_SEEN: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Records that `address` was found in the driver. Allocation- and lock-free.
pub(crate) fn note_driver(address: *mut c_void) {
    DRIVER_SEEN.store(address, Ordering::Relaxed);
}

/// This library's own reference to the driver (a `dlopen` handle it never closes, so the driver
/// stays loaded as long as the pointers taken from it are in use).
static DRIVER_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(ptr::null_mut());

/// Finds the driver's own definition of `name` (an exact ELF name): the next definition after
/// this library in the global scope, else the driver the `dlsym` hook saw, else `libcuda.so.1` if
/// already loaded, else `libcuda.so.1` loaded now. Never returns one of this library's symbols.
/// Cold path: may allocate (inside the loader) and takes the loader lock.
pub(crate) fn driver_symbol(name: &CStr) -> Option<NonNull<c_void>> {
    // SAFETY: RTLD_NEXT is a valid pseudo-handle.
    if let Some(found) = unsafe { lookup_in(libc::RTLD_NEXT, name) }.filter(|p| !is_own(p.as_ptr()))
    {
        return Some(found);
    }
    let handle = driver_handle()?;
    // SAFETY: `handle` is this library's own, never-closed reference.
    let found = unsafe { lookup_in(handle.as_ptr(), name) }.filter(|p| !is_own(p.as_ptr()));
    if found.is_none() {
        clear_dlerror();
    }
    found
}

/// This library's handle to the driver, opened once (idempotent race; a loser closes its own).
fn driver_handle() -> Option<NonNull<c_void>> {
    if let Some(handle) = NonNull::new(DRIVER_HANDLE.load(Ordering::Acquire)) {
        return Some(handle);
    }
    let opened = open_seen_driver()
        .or_else(|| open(c"libcuda.so.1".as_ptr(), libc::RTLD_NOLOAD))
        .or_else(|| open(c"libcuda.so.1".as_ptr(), 0))?;
    match DRIVER_HANDLE.compare_exchange(
        ptr::null_mut(),
        opened.as_ptr(),
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => Some(opened),
        Err(winner) => {
            // SAFETY: `opened` is our own extra reference from `dlopen`; dropping it leaves the
            // winner's reference in place.
            unsafe { libc::dlclose(opened.as_ptr()) };
            NonNull::new(winner)
        }
    }
}

/// A reference to the object holding the address the `dlsym` hook saw, if it is still a driver.
fn open_seen_driver() -> Option<NonNull<c_void>> {
    let info = symbol_at(DRIVER_SEEN.load(Ordering::Relaxed))?;
    if provider(info.file()) != Provider::Driver {
        return None;
    }
    open(info.file_ptr(), libc::RTLD_NOLOAD)
}

/// `dlopen(path, RTLD_NOW | RTLD_LOCAL | extra)`, clearing the error state it leaves on failure so
/// that the application's next `dlerror()` does not report our probe.
fn open(path: *const c_char, extra: c_int) -> Option<NonNull<c_void>> {
    // SAFETY: `path` is a NUL-terminated path or name; RTLD_NOLOAD only takes a reference to an
    // object already loaded, otherwise the driver's constructors run here, outside any lock of ours.
    let handle =
        NonNull::new(unsafe { libc::dlopen(path, libc::RTLD_NOW | libc::RTLD_LOCAL | extra) });
    if handle.is_none() {
        clear_dlerror();
    }
    handle
}

/// Forgets the loader error our own failed probe left behind.
pub(crate) fn clear_dlerror() {
    // SAFETY: `dlerror` only reads and resets the calling thread's error state.
    unsafe { libc::dlerror() };
}

/// Runs `f` with a reference to the object at `address` held open, if it is loaded.
pub(crate) fn with_object_of<T>(
    address: *const c_void,
    f: impl FnOnce(NonNull<c_void>) -> Option<T>,
) -> Option<T> {
    let info = symbol_at(address)?;
    let handle = open(info.file_ptr(), libc::RTLD_NOLOAD)?;
    let result = f(handle);
    // SAFETY: `handle` is the extra reference `open` just took.
    unsafe { libc::dlclose(handle.as_ptr()) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_by_basename() {
        assert_eq!(
            provider(b"/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            Provider::Driver
        );
        assert_eq!(provider(b"libcuda.so"), Provider::Driver);
        assert_eq!(provider(b"/opt/x/libcuda.so.580.65.06"), Provider::Driver);
        assert_eq!(provider(b"/x/libcudart.so.12"), Provider::Runtime);
        assert_eq!(provider(b"libcudart.so"), Provider::Runtime);
        assert_eq!(provider(b"/x/libcudart_static.so"), Provider::Other);
        assert_eq!(provider(b"/x/libcudaplugin.so"), Provider::Other);
        assert_eq!(provider(b"/x/libcuda.so-old/libfoo.so"), Provider::Other);
        assert_eq!(provider(b"/x/libcuinterpose.so"), Provider::Other);
        assert_eq!(provider(b""), Provider::Other);
        assert_eq!(provider(b"/"), Provider::Other);
    }

    #[test]
    fn real_dlsym_finds_libc_symbols() {
        // SAFETY: RTLD_DEFAULT is a valid pseudo-handle.
        let found = unsafe { lookup_in(libc::RTLD_DEFAULT, c"getpid") };
        assert!(found.is_some());
        let info = symbol_at(found.map_or(ptr::null(), |p| p.as_ptr().cast_const()));
        assert!(info.is_some_and(|info| {
            info.exact_name(found.map_or(ptr::null(), |p| p.as_ptr()))
                .is_some()
        }));
    }

    #[test]
    fn the_first_pointer_published_wins_and_is_never_looked_up_again() {
        let slot = AtomicPtr::new(ptr::null_mut());
        let (first, second) = (8 as *mut c_void, 16 as *mut c_void);
        assert_eq!(
            found_once(&slot, || None),
            None,
            "nothing found: nothing published"
        );
        assert_eq!(publish_once(&slot, first).map(NonNull::as_ptr), Some(first));
        assert_eq!(
            publish_once(&slot, second).map(NonNull::as_ptr),
            Some(first)
        );
        let mut looked = false;
        let looked_up = found_once(&slot, || {
            looked = true;
            NonNull::new(second)
        });
        assert_eq!(looked_up.map(NonNull::as_ptr), Some(first));
        assert!(!looked, "a published pointer is not looked up again");

        // Threads racing to publish all return the one that won.
        let raced = AtomicPtr::new(ptr::null_mut());
        let winners: Vec<usize> = std::thread::scope(|s| {
            let racers: Vec<_> = (1..=8usize)
                .map(|i| {
                    let raced = &raced;
                    s.spawn(move || {
                        found_once(raced, || NonNull::new((i * 8) as *mut c_void))
                            .map_or(0, |p| p.as_ptr() as usize)
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap_or(0)).collect()
        });
        let published = raced.load(Ordering::Acquire) as usize;
        assert_ne!(published, 0);
        assert!(
            winners.iter().all(|&w| w == published),
            "{winners:?} vs {published}"
        );
    }

    #[test]
    fn own_addresses_are_recognised() {
        assert!(is_own(provider as fn(&[u8]) -> Provider as *const c_void));
        assert!(!is_own(
            libc::getpid as unsafe extern "C" fn() -> libc::pid_t as *const c_void
        ));
        assert!(!is_own(ptr::null()));
    }
}
