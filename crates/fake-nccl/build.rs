//! Gives the cdylib the soname of the real library, so a program that loads `libnccl.so.2` (or
//! was linked against it) finds this one first on `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
