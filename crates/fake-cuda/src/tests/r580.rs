//! The r580 behaviours of `docs/measurements.md`, reproduced:
//!
//! - an importer checkpointed with a live import (mapped, or unmapped but not released) "succeeds",
//!   then restore fails with NOT_SUPPORTED, unlock with ILLEGAL_STATE, and it is unusable;
//! - a legacy IPC importer fails restore with INVALID_VALUE, unusable after;
//! - an exporter whose allocation a running peer maps does not checkpoint (TIMEOUT after the
//!   lock's timeout here; the real driver hangs), but it does once that peer is locked too;
//! - an exported fd merely held open by a third process does not block;
//! - an importer that unmapped and released checkpoints and restores fine, and sharing works again
//!   afterwards, both ways.

use std::os::fd::AsRawFd;

use cuda_abi::{CUresult, process_state};

use super::checkpoint::{Tool, tool_loop};
use super::*;
use crate::exports as x;

/// Exporter role: a POSIX-capable buffer with `text` at 0, exported; says "fd <n>", then
/// closes its own copy of the fd once told "close". Returns (handle, address).
fn export_buffer(text: &[u8]) -> (u64, u64) {
    init_ctx(0);
    let (h, va) = vmm_buffer(GRAN, 0, POSIX);
    assert_eq!(write(va, text), SUCCESS);
    let fd = export_fd(h).unwrap();
    say(&format!("fd {fd}"));
    wait_for("close");
    // SAFETY: our own exported descriptor, no longer needed (the peer opened its own).
    unsafe { libc::close(fd) };
    say("closed");
    (h, va)
}

/// Importer role: opens the exporter's descriptor through /proc and imports it.
fn import_from(line: &str) -> u64 {
    let mut it = line.split_whitespace();
    let (pid, fd) = (num(it.next().unwrap()), num(it.next().unwrap()));
    let file = std::fs::File::open(format!("/proc/{pid}/fd/{fd}")).unwrap();
    import_fd(file.as_raw_fd()).unwrap()
}

fn map_rw(h: u64, dev: i32) -> u64 {
    let va = reserve(GRAN, 0, 0).unwrap();
    assert_eq!(map(va, GRAN, 0, h), SUCCESS);
    assert_eq!(set_access(va, GRAN, &[(dev, RW)]), SUCCESS);
    va
}

/// In a peer whose restore failed: every driver call fails.
fn assert_unusable() {
    let mut n = 0;
    assert_eq!(
        cu!(x::cuDeviceGetCount(&mut n)),
        CUresult::ERROR_ILLEGAL_STATE
    );
    assert_eq!(alloc(10), Err(CUresult::ERROR_ILLEGAL_STATE));
}

/// Starts an exporter and an importer that imported (and mapped, if `mapped`) its buffer.
fn exporter_and_importer(test: &str, dir: &StateDir) -> (Peer, Peer) {
    let mut exporter = Peer::spawn(test, "exporter", dir, &[]);
    let fd = exporter.expect("fd");
    let mut importer = Peer::spawn(test, "importer", dir, &[]);
    importer.send(&format!("{} {fd}", exporter.pid()));
    importer.expect("imported");
    exporter.send("close");
    exporter.expect("closed");
    (exporter, importer)
}

fn live_import_case(test: &str, mapped: bool) {
    match role(test).as_deref() {
        Some("tool") => return tool_loop(),
        Some("exporter") => {
            let (_, va) = export_buffer(b"exported");
            wait_for("check");
            assert_eq!(
                read(va, 8).unwrap(),
                b"exported",
                "the exporter is unaffected"
            );
            say("ok");
            return;
        }
        Some("importer") => {
            init_ctx(0);
            let h = import_from(&hear());
            if mapped {
                let va = map_rw(h, 0);
                assert_eq!(read(va, 8).unwrap(), b"exported");
            }
            say("imported");
            wait_for("check");
            assert_unusable();
            say("ok");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(test);
    let (mut exporter, mut importer) = exporter_and_importer(test, &dir);
    let mut tool = Tool::spawn(test, &dir, &[]);
    let pid = importer.pid();
    tool.suspend(pid);
    assert_eq!(tool.restore(pid, &[]), CUresult::ERROR_NOT_SUPPORTED);
    assert_eq!(tool.unlock(pid), CUresult::ERROR_ILLEGAL_STATE);
    assert_eq!(tool.state(pid), Ok(process_state::FAILED));
    importer.send("check");
    importer.expect("ok");
    importer.finish();
    exporter.send("check");
    exporter.expect("ok");
    exporter.finish();
    tool.finish();
}

const LIVE_MAPPED: &str = "tests::r580::importer_with_mapped_import_fails_restore";

#[test]
fn importer_with_mapped_import_fails_restore() {
    live_import_case(LIVE_MAPPED, true);
}

const LIVE_HELD: &str = "tests::r580::importer_holding_unmapped_import_fails_restore";

#[test]
fn importer_holding_unmapped_import_fails_restore() {
    live_import_case(LIVE_HELD, false);
}

const IPC: &str = "tests::r580::legacy_ipc_importer_fails_restore";

#[test]
fn legacy_ipc_importer_fails_restore() {
    match role(IPC).as_deref() {
        Some("tool") => return tool_loop(),
        Some("exporter") => {
            init_ctx(0);
            let d = alloc(3 * MIB).unwrap();
            assert_eq!(write(d + 10, b"legacy"), SUCCESS);
            let mut h = cuda_abi::CUipcMemHandle::default();
            assert_eq!(cu!(x::cuIpcGetMemHandle(&mut h, d + 10)), SUCCESS);
            let hex: String = h
                .reserved
                .iter()
                .map(|b| format!("{:02x}", *b as u8))
                .collect();
            say(&format!("handle {hex}"));
            wait_for("check");
            assert_eq!(
                read(d + 100, 4).unwrap(),
                b"back",
                "written by the importer"
            );
            say("ok");
            return;
        }
        Some("importer") => {
            init_ctx(1);
            let hex = hear();
            let mut h = cuda_abi::CUipcMemHandle::default();
            for (i, b) in h.reserved.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as std::ffi::c_char;
            }
            let mut d = 0;
            assert_eq!(cu!(x::cuIpcOpenMemHandle_v2(&mut d, h, 1)), SUCCESS);
            let mut again = 0;
            assert_eq!(cu!(x::cuIpcOpenMemHandle(&mut again, h, 1)), SUCCESS);
            assert_eq!(again, d, "opened twice: the same mapping");
            assert_eq!(cu!(x::cuIpcCloseMemHandle(again)), SUCCESS);
            assert_eq!(read(d + 10, 6).unwrap(), b"legacy");
            assert_eq!(write(d + 100, b"back"), SUCCESS);
            assert_eq!(
                cu!(x::cuIpcOpenMemHandle_v2(&mut again, h, 2)),
                CUresult::ERROR_INVALID_VALUE
            );
            let mut bogus = h;
            bogus.reserved[0] = 0;
            assert_eq!(
                cu!(x::cuIpcOpenMemHandle_v2(&mut again, bogus, 1)),
                CUresult::ERROR_INVALID_VALUE
            );
            assert_eq!(
                cu!(x::cuIpcCloseMemHandle(d + 1)),
                CUresult::ERROR_INVALID_VALUE
            );
            assert_eq!(
                usage(std::process::id() as i32, -1),
                0,
                "charged to the creator"
            );
            say("imported");
            wait_for("check");
            assert_unusable();
            say("ok");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(IPC);
    let mut exporter = Peer::spawn(IPC, "exporter", &dir, &[]);
    let handle = exporter.expect("handle");
    let mut importer = Peer::spawn(IPC, "importer", &dir, &[]);
    importer.send(&handle);
    importer.expect("imported");
    let mut tool = Tool::spawn(IPC, &dir, &[]);
    let pid = importer.pid();
    tool.suspend(pid);
    assert_eq!(tool.restore(pid, &[]), CUresult::ERROR_INVALID_VALUE);
    assert_eq!(tool.unlock(pid), CUresult::ERROR_ILLEGAL_STATE);
    importer.send("check");
    importer.expect("ok");
    importer.finish();
    exporter.send("check");
    exporter.expect("ok");
    exporter.finish();
    tool.finish();
}

const HANG: &str = "tests::r580::exporter_mapped_by_a_running_peer_does_not_checkpoint";

#[test]
fn exporter_mapped_by_a_running_peer_does_not_checkpoint() {
    match role(HANG).as_deref() {
        Some("tool") => return tool_loop(),
        Some("exporter") => {
            let (_, va) = export_buffer(b"exported");
            // Checked after the timed-out checkpoint, then after the real round trip.
            for _ in 0..2 {
                wait_for("check");
                assert_eq!(read(va, 8).unwrap(), b"exported");
                say("ok");
            }
            return;
        }
        Some("importer") => {
            init_ctx(0);
            let h = import_from(&hear());
            let va = map_rw(h, 0);
            assert_eq!(read(va, 8).unwrap(), b"exported");
            say("imported");
            wait_for("check");
            say("ok");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(HANG);
    let (mut exporter, mut importer) = exporter_and_importer(HANG, &dir);
    let mut tool = Tool::spawn(HANG, &dir, &[]);
    let pid = exporter.pid();
    let held = tool.usage(pid);
    assert_eq!(tool.lock(pid, 1000), SUCCESS);
    assert_eq!(tool.checkpoint(pid), CUresult::ERROR_TIMEOUT);
    assert_eq!(
        tool.state(pid),
        Ok(process_state::LOCKED),
        "left locked, unchanged"
    );
    assert_eq!(tool.usage(pid), held);
    assert_eq!(tool.unlock(pid), SUCCESS);
    exporter.send("check");
    exporter.expect("ok");
    // Both locked, then both checkpointed: both "succeed"; the importer's restore fails.
    let ipid = importer.pid();
    assert_eq!(tool.lock(ipid, 0), SUCCESS);
    assert_eq!(tool.lock(pid, 0), SUCCESS);
    assert_eq!(tool.checkpoint(pid), SUCCESS);
    assert_eq!(tool.checkpoint(ipid), SUCCESS);
    assert_eq!(tool.usage(pid), 0);
    tool.resume(pid);
    assert_eq!(tool.restore(ipid, &[]), CUresult::ERROR_NOT_SUPPORTED);
    exporter.send("check");
    exporter.expect("ok");
    exporter.finish();
    importer.send("check");
    importer.expect("ok");
    importer.finish();
    tool.finish();
}

const HELD: &str = "tests::r580::fd_held_by_a_third_process_does_not_block";

#[test]
fn fd_held_by_a_third_process_does_not_block() {
    match role(HELD).as_deref() {
        Some("tool") => return tool_loop(),
        Some("exporter") => {
            let (_, va) = export_buffer(b"exported");
            wait_for("check");
            assert_eq!(read(va, 8).unwrap(), b"exported", "restored");
            say("ok");
            return;
        }
        Some("holder") => {
            let line = hear();
            let mut it = line.split_whitespace();
            let (pid, fd) = (num(it.next().unwrap()), num(it.next().unwrap()));
            let file = std::fs::File::open(format!("/proc/{pid}/fd/{fd}")).unwrap();
            say("imported");
            wait_for("check");
            drop(file);
            say("ok");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(HELD);
    let mut exporter = Peer::spawn(HELD, "exporter", &dir, &[]);
    let fd = exporter.expect("fd");
    let mut holder = Peer::spawn(HELD, "holder", &dir, &[]);
    holder.send(&format!("{} {fd}", exporter.pid()));
    holder.expect("imported");
    exporter.send("close");
    exporter.expect("closed");
    let mut tool = Tool::spawn(HELD, &dir, &[]);
    let pid = exporter.pid();
    assert_eq!(tool.lock(pid, 1000), SUCCESS);
    assert_eq!(tool.checkpoint(pid), SUCCESS);
    tool.resume(pid);
    exporter.send("check");
    exporter.expect("ok");
    exporter.finish();
    holder.send("check");
    holder.expect("ok");
    holder.finish();
    tool.finish();
}

const RELEASED: &str = "tests::r580::released_importer_round_trips_and_shares_again";

#[test]
fn released_importer_round_trips_and_shares_again() {
    match role(RELEASED).as_deref() {
        Some("tool") => return tool_loop(),
        Some("exporter") => {
            let (h, va) = export_buffer(b"exported");
            wait_for("export-again");
            assert_eq!(
                read(va + 64, 6).unwrap(),
                b"before",
                "importer's write survived"
            );
            let fd = export_fd(h).unwrap();
            say(&format!("fd {fd}"));
            wait_for("check");
            assert_eq!(
                read(va + 128, 5).unwrap(),
                b"after",
                "visible after restore"
            );
            assert_eq!(write(va + 256, b"reply"), SUCCESS);
            say("ok");
            return;
        }
        Some("importer") => {
            init_ctx(0);
            let h = import_from(&hear());
            let va = map_rw(h, 0);
            assert_eq!(write(va + 64, b"before"), SUCCESS);
            assert_eq!(unmap(va, GRAN), SUCCESS);
            assert_eq!(release(h), SUCCESS);
            say("imported");
            let again = import_from(&hear());
            assert_eq!(map(va, GRAN, 0, again), SUCCESS, "at the original address");
            assert_eq!(set_access(va, GRAN, &[(0, RW)]), SUCCESS);
            assert_eq!(read(va, 8).unwrap(), b"exported");
            assert_eq!(write(va + 128, b"after"), SUCCESS);
            say("written");
            wait_for("check");
            assert_eq!(read(va + 256, 5).unwrap(), b"reply", "the exporter's write");
            say("ok");
            return;
        }
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let dir = StateDir::new(RELEASED);
    let (mut exporter, mut importer) = exporter_and_importer(RELEASED, &dir);
    let mut tool = Tool::spawn(RELEASED, &dir, &[]);
    let (epid, ipid) = (exporter.pid(), importer.pid());
    tool.suspend(ipid);
    tool.suspend(epid);
    tool.resume(epid);
    tool.resume(ipid);
    exporter.send("export-again");
    let fd = exporter.expect("fd");
    importer.send(&format!("{epid} {fd}"));
    importer.expect("written");
    exporter.send("check");
    exporter.expect("ok");
    importer.send("check");
    importer.expect("ok");
    importer.finish();
    exporter.finish();
    tool.finish();
}
