//! Sharing between processes: an exported allocation really shares its bytes, both ways, over
//! POSIX descriptors and FABRIC handles; accounting sees every live process.

use std::os::fd::AsRawFd;

use cuda_abi::CUresult;

use super::*;

const TEST: &str = "tests::share::posix_fd_shares_bytes_both_ways";

/// The exporter creates, maps and writes; the importer opens the exporter's descriptor through
/// /proc (as PyTorch does with pidfd_getfd), imports, maps, reads and writes back.
#[test]
fn posix_fd_shares_bytes_both_ways() {
    match role(TEST).as_deref() {
        Some("exporter") => {
            init_ctx(0);
            let (h, va) = vmm_buffer(GRAN, 0, POSIX);
            assert_eq!(write(va, b"from exporter"), SUCCESS);
            let fd = export_fd(h).unwrap();
            say(&format!("fd {fd}"));
            wait_for("check");
            assert_eq!(read(va + 100, 13).unwrap(), b"from importer");
            say("done");
            return;
        }
        Some("importer") => {
            init_ctx(1);
            let line = hear();
            let mut it = line.split_whitespace();
            let (pid, fd) = (num(it.next().unwrap()), num(it.next().unwrap()));
            let file = std::fs::File::open(format!("/proc/{pid}/fd/{fd}")).unwrap();
            let h = import_fd(file.as_raw_fd()).unwrap();
            drop(file);
            let va = reserve(GRAN, 0, 0).unwrap();
            assert_eq!(map(va, GRAN, 0, h), SUCCESS);
            assert_eq!(set_access(va, GRAN, &[(1, RW)]), SUCCESS);
            assert_eq!(read(va, 13).unwrap(), b"from exporter");
            assert_eq!(write(va + 100, b"from importer"), SUCCESS);
            assert_eq!(
                usage(std::process::id() as i32, -1),
                0,
                "charged to the creator"
            );
            say("written");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(TEST);
    let mut exporter = Peer::spawn(TEST, "exporter", &dir, &[]);
    let fd = exporter.expect("fd");
    let mut importer = Peer::spawn(TEST, "importer", &dir, &[]);
    importer.send(&format!("{} {fd}", exporter.pid()));
    importer.expect("written");
    importer.finish();
    exporter.send("check");
    exporter.expect("done");
    exporter.finish();
}

const FABRIC_TEST: &str = "tests::share::fabric_handle_shares_bytes";

#[test]
fn fabric_handle_shares_bytes() {
    match role(FABRIC_TEST).as_deref() {
        Some("exporter") => {
            init_ctx(0);
            let (h, va) = vmm_buffer(GRAN, 0, POSIX | FABRIC);
            assert_eq!(write(va, b"fabric!"), SUCCESS);
            let fh = export_fabric(h).unwrap();
            let hex: String = fh.data.iter().map(|b| format!("{b:02x}")).collect();
            say(&format!("handle {hex}"));
            wait_for("check");
            assert_eq!(read(va + 8, 4).unwrap(), b"back");
            say("done");
            return;
        }
        Some("importer") => {
            init_ctx(0);
            let hex = hear();
            let mut data = [0u8; 64];
            for (i, b) in data.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            let h = import_fabric(&cuda_abi::CUmemFabricHandle { data }).unwrap();
            let va = reserve(GRAN, 0, 0).unwrap();
            assert_eq!(map(va, GRAN, 0, h), SUCCESS);
            assert_eq!(set_access(va, GRAN, &[(0, RW)]), SUCCESS);
            assert_eq!(read(va, 7).unwrap(), b"fabric!");
            assert_eq!(write(va + 8, b"back"), SUCCESS);
            // A POSIX import of a FABRIC-only claim is checked against the trailer's types.
            let mut bad = data;
            bad[16] ^= 0xff;
            assert_eq!(
                import_fabric(&cuda_abi::CUmemFabricHandle { data: bad }),
                Err(CUresult::ERROR_INVALID_VALUE),
                "inode mismatch"
            );
            say("written");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(FABRIC_TEST);
    let mut exporter = Peer::spawn(FABRIC_TEST, "exporter", &dir, &[]);
    let hex = exporter.expect("handle");
    let mut importer = Peer::spawn(FABRIC_TEST, "importer", &dir, &[]);
    importer.send(&hex);
    importer.expect("written");
    importer.finish();
    exporter.send("check");
    exporter.expect("done");
    exporter.finish();
}

const ACCT_TEST: &str = "tests::share::accounting_spans_live_processes";

/// cuMemGetInfo's free memory is the total less every live process's usage; a process that
/// exits stops counting, and `fakeCudaUsage` reads the same numbers from outside.
#[test]
fn accounting_spans_live_processes() {
    let env = [("FAKE_CUDA_DEVICE_MEMORY", "256M")];
    match role(ACCT_TEST).as_deref() {
        Some("holder") => {
            init_ctx(0);
            let _h = mem_create(32 * MIB, &prop(0, 0)).unwrap();
            let _d = alloc(MIB).unwrap();
            say("holding");
            wait_for("exit");
            return;
        }
        Some("observer") => {
            init_ctx(0);
            let holder = num(&hear()) as i32;
            let (free, total) = mem_info().unwrap();
            assert_eq!(total, 256 * MIB);
            assert_eq!(free, 256 * MIB - 34 * MIB);
            assert_eq!(usage(holder, 0), (34 * MIB) as u64);
            assert_eq!(usage(holder, 1), 0);
            assert_eq!(usage(0, -1), (34 * MIB) as u64);
            assert_eq!(
                mem_create(224 * MIB, &prop(0, 0)),
                Err(CUresult::ERROR_OUT_OF_MEMORY)
            );
            let mine = mem_create(222 * MIB, &prop(0, 0)).unwrap();
            assert_eq!(mem_info().unwrap().0, 0);
            assert_eq!(release(mine), SUCCESS);
            say("checked");
            wait_for("again");
            assert_eq!(mem_info().unwrap().0, 256 * MIB, "the holder is gone");
            assert_eq!(usage(holder, -1), 0);
            say("done");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(ACCT_TEST);
    let mut holder = Peer::spawn(ACCT_TEST, "holder", &dir, &env);
    holder.expect("holding");
    let mut observer = Peer::spawn(ACCT_TEST, "observer", &dir, &env);
    observer.send(&holder.pid().to_string());
    observer.expect("checked");
    holder.send("exit");
    holder.finish();
    observer.send("again");
    observer.expect("done");
    observer.finish();
}
