//! Gives the cdylib the soname of the real driver, so programs linked against `libcuda.so.1` load it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
