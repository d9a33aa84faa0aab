//! The exported `dlsym`.
//!
//! glibc resolves `RTLD_NEXT` ("the next object after the caller") and `RTLD_DEFAULT` (the
//! caller's scope, which includes a `RTLD_LOCAL` library's own dependencies) from the return
//! address of its caller. A Rust function that forwarded those calls would become the caller, and
//! a second interposer's `dlsym(RTLD_NEXT, "puts")` would find its own `puts` again and recurse.
//! So the entry is a naked trampoline: pseudo-handles tail-jump into glibc with the application's
//! return address still on the stack; only explicit handles reach Rust ([`explicit`]).
//!
//! Nothing on either path allocates or takes a lock (see `loader`).

#![allow(unsafe_code)] // naked entry point and loader FFI

use core::ffi::{CStr, c_char, c_void};

use crate::loader::{self, Provider};

/// `dlsym(handle, symbol)`.
///
/// `RTLD_NEXT` (`-1`) and `RTLD_DEFAULT` (`0`) jump straight to glibc's `dlsym` (found on first
/// use, see [`loader::resolve_real_dlsym`]); every other handle goes to [`explicit`].
///
/// # Safety
/// The contract of `dlsym(3)`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), unsafe(no_mangle))]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmp rdi, -1",
        "je 2f",
        "test rdi, rdi",
        "je 2f",
        "jmp {explicit}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jne 3f",
        // First lookup in the process: find glibc's dlsym, keeping the arguments (and a 16-byte
        // aligned stack for the call: entry is 8 mod 16, two pushes and 8 more make it 0).
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {resolve}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "3:",
        // A jump, not a call: glibc sees the application's return address.
        "jmp rax",
        explicit = sym explicit,
        real = sym loader::REAL_DLSYM,
        resolve = sym loader::resolve_real_dlsym,
    );
}

/// `dlsym` with an explicit handle: glibc's answer, except that a driver function the shim wraps
/// comes back as the wrapper, and the driver's and runtime's resolvers as ours.
///
/// Only names starting with `cu` are examined, and only a result that `dladdr` places in
/// `libcuda.so*` (or `libcudart.so*` for the runtime resolvers) is replaced, so a plugin's
/// same-named symbol is never substituted.
unsafe extern "C" fn explicit(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // SAFETY: the application's handle and symbol, passed on as it gave them.
    let found = unsafe { loader::real_dlsym()(handle, symbol) };
    if found.is_null() || symbol.is_null() {
        return found;
    }
    // SAFETY: `symbol` is a NUL-terminated string (glibc just read it); measuring it allocates
    // nothing.
    let name = unsafe { CStr::from_ptr(symbol) }.to_bytes();
    if !name.starts_with(b"cu") {
        return found;
    }
    let Some(info) = loader::symbol_at(found) else {
        return found;
    };
    let replacement = match loader::provider(info.file()) {
        Provider::Driver => {
            loader::note_driver(found);
            crate::real::note_resolver(name, found);
            crate::resolver::exported_for(name)
        }
        Provider::Runtime => {
            crate::cudart::note_real(name, found);
            crate::cudart::exported_for(name)
        }
        Provider::Other => None,
    };
    replacement.map_or(found, |ours| ours.as_ptr())
}
