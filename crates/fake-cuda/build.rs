//! Gives the cdylib the soname of the real driver, so programs linked against `libcuda.so.1` load
//! it, and binds the library's references to its own functions inside it (`-Bsymbolic-functions`):
//! the pointers `cuGetProcAddress` hands out are then the fake's own definitions even when an
//! interposer exports the same names, as the real driver's are.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rerun-if-changed=build.rs");
}
