//! The built `libcuda.so` exports exactly the intended symbols, with the driver's soname.

use std::collections::BTreeSet;
use std::process::Command;

use crate::exports::EXPORTED;

fn library() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let lib = profile_dir.join("libcuda.so");
    assert!(
        lib.exists(),
        "{} is missing: build first (cargo build -p fake-cuda)",
        lib.display()
    );
    lib
}

#[test]
fn the_library_exports_exactly_the_entry_points_and_the_usage_reader() {
    let lib = library();
    let out = Command::new("nm")
        .args(["-D", "--defined-only", "--format=posix"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) is needed to list the library's symbols");
    assert!(out.status.success());
    let found: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    let mut wanted: BTreeSet<String> = EXPORTED.iter().map(|s| (*s).to_owned()).collect();
    wanted.insert("fakeCudaUsage".to_owned());
    assert_eq!(
        found,
        wanted,
        "exports of {} (rebuild it if it is stale: cargo build -p fake-cuda)",
        lib.display()
    );
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&dynamic.stdout).contains("Library soname: [libcuda.so.1]"));
}
