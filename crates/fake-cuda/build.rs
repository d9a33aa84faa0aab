//! Gives the cdylib the soname of the real driver, so programs linked against `libcuda.so.1` load
//! it, and binds the library's references to its own functions inside it (`-Bsymbolic`): the
//! pointers `cuGetProcAddress` hands out are then the fake's own definitions even when an
//! interposer exports the same names, as the real driver's are. The library exports functions
//! only, so this binds exactly what `-Bsymbolic-functions` would; zig's linker (the release build,
//! scripts/build-dist.sh) knows only `-Bsymbolic`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rerun-if-changed=build.rs");
}
