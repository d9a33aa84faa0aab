//! Helper processes for what `cuinterpose-workload` cannot do: the test binary runs itself as an
//! ignored test (`helper_process`) with a role in [`ROLE_ENV`], does its part, writes its PID to
//! [`READY_FILE`] in [`DIR_ENV`], and stays until its parent (the tree's root) goes away.
//!
//! - `multicast`: `cuInit` and `cuMulticastCreate` through the shim (fake driver only: multicast
//!   must never run on a GPU, and these tests only ever load the fake).
//! - `fabric-import`: waits for [`FABRIC_FILE`] (a FABRIC handle in hex, exported by a workload),
//!   then imports it through the shim.
//! - `old-shim`: maps `libcuinterpose.so` (preloaded) and `libcuda.so.1` without initialising CUDA,
//!   and serves a control socket of its own that answers every frame in another protocol version,
//!   as a shim of another release would.

#![allow(unsafe_code)] // calls into the dynamically loaded driver; each block says why it is sound

use cuda::pfn;
use cuda_abi::{CUcontext, CUmemGenericAllocationHandle, CUmulticastObjectProp, handle_type};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const ROLE_ENV: &str = "CUITEST_HELPER";
pub const DIR_ENV: &str = "CUITEST_HELPER_DIR";
pub const READY_FILE: &str = "ready";
pub const FABRIC_FILE: &str = "fabric.hex";

/// The helper's entry point (the body of the ignored `helper_process` test).
pub fn main() {
    let role = std::env::var(ROLE_ENV)
        .expect("helper_process is started by the tests of this file, with a role");
    let dir = PathBuf::from(std::env::var(DIR_ENV).expect("helper directory"));
    let parent = std::os::unix::process::parent_id();
    // Held for the life of the process: the mappings and handles are what the tests look at.
    let _library = match role.as_str() {
        "multicast" => multicast(),
        "fabric-import" => fabric_import(&dir),
        "old-shim" => old_shim(),
        other => panic!("unknown helper role {other}"),
    };
    let ready = dir.join(READY_FILE);
    let temp = dir.join("ready.tmp");
    std::fs::write(&temp, std::process::id().to_string()).expect("ready file");
    std::fs::rename(&temp, &ready).expect("ready file");
    // Not synchronisation: a watchdog so that no helper outlives its tree.
    while std::os::unix::process::parent_id() == parent {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::process::exit(0);
}

fn driver() -> libloading::Library {
    // SAFETY: loading the (fake) CUDA driver runs its initialisers, which need nothing from us.
    unsafe { libloading::Library::new("libcuda.so.1") }.expect("dlopen libcuda.so.1")
}

/// The driver entry point `name`, typed `T` (a `cuda::pfn` type).
fn entry<T: Copy>(lib: &libloading::Library, name: &str) -> T {
    let symbol = format!("{name}\0");
    // SAFETY: the symbol is the driver's entry point of that name (the shim's wrapper when the
    // shim is preloaded), whose C signature the caller's `T` mirrors (cuda-abi).
    let found = unsafe { lib.get::<T>(symbol.as_bytes()) };
    *found.unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn init(lib: &libloading::Library) {
    let init = entry::<pfn::cuInit>(lib, "cuInit");
    let retain = entry::<pfn::cuDevicePrimaryCtxRetain>(lib, "cuDevicePrimaryCtxRetain");
    let set_current = entry::<pfn::cuCtxSetCurrent>(lib, "cuCtxSetCurrent");
    // SAFETY: flags 0.
    assert!(unsafe { init(0) }.is_success(), "cuInit");
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer, device 0 exists on the fake.
    assert!(unsafe { retain(&mut ctx, 0) }.is_success(), "retain");
    // SAFETY: the context just retained.
    assert!(unsafe { set_current(ctx) }.is_success(), "set current");
}

fn multicast() -> libloading::Library {
    let lib = driver();
    init(&lib);
    let create = entry::<pfn::cuMulticastCreate>(&lib, "cuMulticastCreate");
    let prop = CUmulticastObjectProp {
        numDevices: 1,
        size: 2 << 20,
        handleTypes: u64::from(handle_type::POSIX_FILE_DESCRIPTOR),
        flags: 0,
    };
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and property struct.
    let r = unsafe { create(&mut handle, &prop) };
    assert!(r.is_success(), "cuMulticastCreate: {r:?}");
    lib
}

fn fabric_import(dir: &Path) -> libloading::Library {
    let file = dir.join(FABRIC_FILE);
    let hex = loop {
        match std::fs::read_to_string(&file) {
            Ok(text) if text.ends_with('\n') => break text,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let mut bytes: Vec<u8> = (0..hex.trim().len() / 2)
        .map(|i| u8::from_str_radix(&hex.trim()[2 * i..2 * i + 2], 16).expect("hex"))
        .collect();
    assert_eq!(bytes.len(), 64, "a FABRIC handle is 64 bytes");
    let lib = driver();
    init(&lib);
    let import =
        entry::<pfn::cuMemImportFromShareableHandle>(&lib, "cuMemImportFromShareableHandle");
    let mut handle: CUmemGenericAllocationHandle = 0;
    // SAFETY: for FABRIC the OS handle is a pointer to the 64-byte handle, which lives through
    // the call.
    let r = unsafe { import(&mut handle, bytes.as_mut_ptr().cast(), handle_type::FABRIC) };
    assert!(r.is_success(), "FABRIC import: {r:?}");
    lib
}

fn old_shim() -> libloading::Library {
    let lib = driver();
    let dir = PathBuf::from(std::env::var("CUINTERPOSE_CONTROL_DIR").expect("control dir"));
    let pid = std::process::id();
    let path = dir.join(format!(
        "cuinterpose-{}-{pid}.sock",
        super::pid_namespace(pid)
    ));
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind control socket");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut header = [0u8; protocol::message::HEADER_LEN];
            if stream.read_exact(&mut header).is_err() {
                continue;
            }
            let length = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
            let mut body = vec![0u8; length.min(1 << 20) as usize];
            let _ = stream.read_exact(&mut body);
            // A HELLO answer as a shim one protocol version ahead frames it.
            let reply = protocol::FrameHeader {
                version: protocol::message::PROTOCOL_VERSION + 1,
                kind: 0x101,
                length: 0,
            }
            .encode();
            let _ = stream.write_all(&reply);
        }
    });
    lib
}
