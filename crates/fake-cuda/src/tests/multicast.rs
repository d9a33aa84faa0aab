//! Multicast objects: bookkeeping, bindings, a mappable and shareable backing, error codes.

use cuda_abi::{CUmulticastObjectProp, CUresult};

use super::*;
use crate::exports as x;

const INVALID: CUresult = CUresult::ERROR_INVALID_VALUE;

fn mc_prop(devices: u32, size: usize) -> CUmulticastObjectProp {
    CUmulticastObjectProp {
        numDevices: devices,
        size,
        handleTypes: u64::from(POSIX),
        flags: 0,
    }
}

fn mc_create(p: &CUmulticastObjectProp) -> Result<u64, CUresult> {
    let mut h = 0;
    ck(cu!(x::cuMulticastCreate(&mut h, p)))?;
    Ok(h)
}

isolated_test!(
    multicast_objects_bind_map_and_share,
    &[("FAKE_CUDA_DEVICES", "3")],
    {
        init_ctx(0);
        let me = std::process::id() as i32;
        let p = mc_prop(2, 2 * GRAN);
        let mut g = 0;
        assert_eq!(cu!(x::cuMulticastGetGranularity(&mut g, &p, 0)), SUCCESS);
        assert_eq!(g, GRAN);
        assert_eq!(cu!(x::cuMulticastGetGranularity(&mut g, &p, 2)), INVALID);
        assert_eq!(mc_create(&mc_prop(0, GRAN)), Err(INVALID));
        assert_eq!(
            mc_create(&mc_prop(4, GRAN)),
            Err(INVALID),
            "more devices than exist"
        );
        assert_eq!(mc_create(&mc_prop(2, GRAN + 1)), Err(INVALID));
        assert_eq!(
            mc_create(&CUmulticastObjectProp { flags: 1, ..p }),
            Err(INVALID)
        );
        assert_eq!(
            mc_create(&CUmulticastObjectProp {
                handleTypes: 2,
                ..p
            }),
            Err(CUresult::ERROR_NOT_SUPPORTED)
        );
        let mc = mc_create(&p).unwrap();
        assert_eq!(usage(me, -1), 0, "a multicast object is not charged");

        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 0)), SUCCESS);
        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 0)), INVALID, "added twice");
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc, 7)),
            CUresult::ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc + 1000, 1)),
            INVALID,
            "unknown handle"
        );
        assert_eq!(cu!(x::cuMulticastAddDevice(mc, 1)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mc, 2)),
            INVALID,
            "beyond numDevices"
        );

        let mem0 = mem_create(2 * GRAN, &prop(0, 0)).unwrap();
        let mem2 = mem_create(GRAN, &prop(2, 0)).unwrap();
        assert_eq!(
            cu!(x::cuMulticastAddDevice(mem0, 1)),
            INVALID,
            "not a multicast handle"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, 2 * GRAN, 0)),
            SUCCESS
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, GRAN, 0)),
            INVALID,
            "overlap"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem2, 0, GRAN, 0)),
            CUresult::ERROR_INVALID_DEVICE
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 4096, mem0, 0, GRAN, 0)),
            INVALID
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, 4 * GRAN, 0)),
            INVALID
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mem0, 0, GRAN, 1)),
            INVALID,
            "flags"
        );
        assert_eq!(
            cu!(x::cuMulticastBindMem(mc, 0, mc, 0, GRAN, 0)),
            INVALID,
            "multicast as memory"
        );

        let (mem1, va1) = vmm_buffer(GRAN, 1, 0);
        assert_eq!(cu!(x::cuMulticastBindAddr(mc, GRAN, va1, GRAN, 0)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastBindAddr(
                mc,
                0,
                va1 + 3 * GRAN as u64,
                GRAN,
                0
            )),
            INVALID
        );

        // The multicast object maps like an allocation and can be exported.
        let va = reserve(2 * GRAN, 0, 0).unwrap();
        assert_eq!(map(va, 2 * GRAN, 0, mc), SUCCESS);
        assert_eq!(set_access(va, 2 * GRAN, &[(0, RW)]), SUCCESS);
        assert_eq!(write(va + 5, b"multi"), SUCCESS);
        assert_eq!(read(va + 5, 5).unwrap(), b"multi");
        let fd = export_fd(mc).unwrap();
        let imported = import_fd(fd).unwrap();
        assert_eq!(
            cu!(x::cuMulticastAddDevice(imported, 2)),
            INVALID,
            "the team is the object's, seen through every handle: already complete"
        );
        assert_eq!(release(imported), SUCCESS);
        let mut ap = cuda_abi::CUmemAllocationProp::default();
        assert_eq!(
            cu!(x::cuMemGetAllocationPropertiesFromHandle(&mut ap, mc)),
            INVALID
        );

        assert_eq!(cu!(x::cuMulticastUnbind(mc, 1, GRAN, GRAN)), SUCCESS);
        assert_eq!(
            cu!(x::cuMulticastUnbind(mc, 1, GRAN, GRAN)),
            INVALID,
            "unbound twice"
        );
        assert_eq!(
            cu!(x::cuMulticastUnbind(mc, 9, 0, GRAN)),
            CUresult::ERROR_INVALID_DEVICE
        );
        // A bound allocation outlives its handle until the multicast object goes.
        assert_eq!(release(mem0), SUCCESS);
        assert_eq!(usage(me, 0), (2 * GRAN) as u64);
        assert_eq!(unmap(va, 2 * GRAN), SUCCESS);
        assert_eq!(release(mc), SUCCESS);
        assert_eq!(usage(me, 0), 0, "freed with the multicast object");
        assert_eq!(release(mem1), SUCCESS);
        assert_eq!(release(mem2), SUCCESS);
        // SAFETY: our own exported descriptor.
        unsafe { libc::close(fd) };
    }
);

isolated_test!(
    multicast_can_be_disabled,
    &[("FAKE_CUDA_MULTICAST", "0")],
    {
        init_ctx(0);
        let p = mc_prop(1, GRAN);
        let mut g = 0;
        assert_eq!(
            cu!(x::cuMulticastGetGranularity(&mut g, &p, 0)),
            CUresult::ERROR_NOT_SUPPORTED
        );
        assert_eq!(mc_create(&p), Err(CUresult::ERROR_NOT_SUPPORTED));
    }
);

// Multicast groups across processes: one peer per rank, each on its own device, driven line by
// line. The first rank creates the object and exports it; the others import it through
// /proc/<pid>/fd of the first (as an application passes the descriptor on).

use std::os::fd::AsRawFd;

use cuda_abi::process_state;

use super::checkpoint::{Tool, tool_loop};

const NOT_READY: CUresult = CUresult::ERROR_NOT_READY;
const G: usize = GRAN;

/// Bytes as the test compares them: a zero byte is '.'.
fn shown(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|&b| if b == 0 { '.' } else { char::from(b) })
        .collect()
}

/// The rank role: the first line names its device, then one reply line per command.
fn rank_loop() {
    let dev = num(&hear()) as i32;
    init_ctx(dev);
    let (mut mc, mut mc_size, mut mc_va) = (0u64, 0usize, 0u64);
    let (mut mem, mut mem_va) = (0u64, 0u64);
    let rc = |r: CUresult| say(&format!("rc {}", r.0));
    let data = |r: Result<Vec<u8>, CUresult>| match r {
        Ok(bytes) => say(&format!("data {}", shown(&bytes))),
        Err(code) => say(&format!("data !{}", code.0)),
    };
    loop {
        let line = hear();
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| num(w[i]) as usize;
        match w.first().copied() {
            None | Some("exit") => return,
            Some("create") => {
                mc_size = n(2);
                mc = mc_create(&mc_prop(n(1) as u32, mc_size)).unwrap();
                say(&format!("fd {}", export_fd(mc).unwrap()));
            }
            Some("import") => {
                mc_size = n(3);
                let file = std::fs::File::open(format!("/proc/{}/fd/{}", w[1], w[2])).unwrap();
                mc = import_fd(file.as_raw_fd()).unwrap();
                say("rc 0");
            }
            Some("mem") => {
                (mem, mem_va) = vmm_buffer(n(1), dev, 0);
                say("rc 0");
            }
            Some("add") => rc(cu!(x::cuMulticastAddDevice(mc, dev))),
            Some("bindmem") => rc(cu!(x::cuMulticastBindMem(mc, n(1), mem, n(2), n(3), 0))),
            Some("bindaddr") => rc(cu!(x::cuMulticastBindAddr(
                mc,
                n(1),
                mem_va + n(2) as u64,
                n(3),
                0
            ))),
            Some("unbind") => rc(cu!(x::cuMulticastUnbind(mc, dev, n(1), n(2)))),
            Some("map") => {
                let va = reserve(mc_size, 0, 0).unwrap();
                let r = map(va, mc_size, 0, mc);
                if r == SUCCESS {
                    assert_eq!(set_access(va, mc_size, &[(dev, RW)]), SUCCESS);
                    mc_va = va;
                } else {
                    assert_eq!(address_free(va, mc_size), SUCCESS);
                }
                rc(r);
            }
            // Through the multicast mapping.
            Some("write") => rc(write(mc_va + n(1) as u64, w[2].as_bytes())),
            Some("memset") => rc(cu!(x::cuMemsetD8_v2(
                mc_va + n(1) as u64,
                w[2].as_bytes()[0],
                n(3)
            ))),
            Some("readmc") => data(read(mc_va + n(1) as u64, n(2))),
            // Through this rank's own member allocation (unicast).
            Some("poke") => rc(write(mem_va + n(1) as u64, w[2].as_bytes())),
            Some("readmem") => data(read(mem_va + n(1) as u64, n(2))),
            Some("release") => {
                if mc_va != 0 {
                    assert_eq!(unmap(mc_va, mc_size), SUCCESS);
                    mc_va = 0;
                }
                rc(release(mc));
            }
            Some(other) => panic!("unknown command {other}"),
        }
    }
}

/// The test's handle on one rank.
struct Rank(Peer);

impl Rank {
    fn spawn(test: &str, dir: &StateDir, dev: i32, env: &[(&str, &str)]) -> Rank {
        let mut peer = Peer::spawn(test, &format!("rank{dev}"), dir, env);
        peer.send(&dev.to_string());
        Rank(peer)
    }

    fn call(&mut self, cmd: &str) -> CUresult {
        self.0.send(cmd);
        CUresult(num(&self.0.expect("rc")) as u32)
    }

    fn ok(&mut self, cmd: &str) {
        assert_eq!(self.call(cmd), SUCCESS, "{cmd}");
    }

    fn data(&mut self, cmd: &str) -> String {
        self.0.send(cmd);
        self.0.expect("data")
    }

    fn finish(mut self) {
        self.0.send("exit");
        self.0.finish();
    }
}

/// A rank role or the tool, in the isolated runs of `test`; `false` in the test itself.
fn run_role(test: &str) -> bool {
    match role(test).as_deref() {
        Some("tool") => tool_loop(),
        Some(r) if r.starts_with("rank") => rank_loop(),
        Some(other) => panic!("unknown role {other}"),
        None => return false,
    }
    true
}

/// Ranks on `devices` holding one multicast object of `size` bytes for `devices.len()` devices
/// (created by the first, imported by the others), each with a member allocation of
/// `mem_size` bytes; no device added yet. Also returns what another process imports the
/// object from ("<pid> <fd>").
fn group(
    test: &str,
    dir: &StateDir,
    devices: &[i32],
    size: usize,
    mem_size: usize,
) -> (Vec<Rank>, String) {
    let env = [("FAKE_CUDA_DEVICES", "4")];
    let mut ranks: Vec<Rank> = Vec::new();
    let mut creator = Rank::spawn(test, dir, devices[0], &env);
    creator.0.send(&format!("create {} {size}", devices.len()));
    let fd = creator.0.expect("fd");
    let name = format!("{} {fd}", creator.0.pid());
    ranks.push(creator);
    for &dev in &devices[1..] {
        let mut rank = Rank::spawn(test, dir, dev, &env);
        rank.ok(&format!("import {name} {size}"));
        ranks.push(rank);
    }
    for rank in &mut ranks {
        rank.ok(&format!("mem {mem_size}"));
    }
    (ranks, name)
}

const TWO: &str = "tests::multicast::two_ranks_see_writes_through_the_multicast";

/// Two ranks: the team must be complete before binding or mapping; a write through either
/// rank's multicast mapping reaches both members; a read sees device 0's member; unbinding or
/// releasing the object stops the propagation to that member.
#[test]
fn two_ranks_see_writes_through_the_multicast() {
    if run_role(TWO) {
        return;
    }
    let dir = StateDir::new(TWO);
    let (mut r, _) = group(TWO, &dir, &[0, 1], 2 * G, 2 * G);
    r[0].ok("add");
    assert_eq!(
        r[0].call(&format!("bindmem 0 0 {}", 2 * G)),
        NOT_READY,
        "one device of two added"
    );
    assert_eq!(
        r[1].call("map"),
        NOT_READY,
        "mapping waits for the team too"
    );
    r[1].ok("add");
    assert_eq!(r[1].call("add"), INVALID, "in the team already");
    assert_eq!(r[0].call("add"), INVALID, "the team is full");
    for rank in &mut r {
        rank.ok(&format!("bindmem 0 0 {}", 2 * G));
        rank.ok("map");
    }

    r[1].ok("write 100 hello");
    r[0].ok(&format!("memset {} m 3", G + 7));
    for rank in &mut r {
        assert_eq!(rank.data("readmem 100 5"), "hello");
        assert_eq!(rank.data(&format!("readmem {} 3", G + 7)), "mmm");
    }

    // Members that differ: every read through the multicast sees device 0's.
    r[0].ok("poke 300 zero");
    r[1].ok("poke 300 one.");
    assert_eq!(r[1].data("readmc 300 4"), "zero");
    assert_eq!(r[0].data("readmc 300 4"), "zero");

    r[1].ok(&format!("unbind 0 {}", 2 * G));
    assert_eq!(
        r[1].call(&format!("unbind 0 {}", 2 * G)),
        INVALID,
        "unbound already"
    );
    r[1].ok("write 500 after");
    assert_eq!(r[0].data("readmem 500 5"), "after");
    assert_eq!(r[1].data("readmem 500 5"), ".....", "unbound: not reached");

    // Releasing the object takes rank 0's binding with it.
    r[0].ok("release");
    r[1].ok("write 600 gone");
    assert_eq!(r[0].data("readmem 600 4"), "....");
    for rank in r {
        rank.finish();
    }
}

const FOUR: &str = "tests::multicast::four_ranks_bind_by_memory_and_address_at_offsets";

/// Four ranks bind different parts of their allocations (two by handle, two by address) to
/// different parts of the object: a write reaches exactly the members bound where it lands, at
/// their offsets; reads see the lowest bound device's member; out-of-bounds binds are refused.
#[test]
fn four_ranks_bind_by_memory_and_address_at_offsets() {
    if run_role(FOUR) {
        return;
    }
    let dir = StateDir::new(FOUR);
    let (mut r, _) = group(FOUR, &dir, &[0, 1, 2, 3], 2 * G, 2 * G);
    for rank in &mut r {
        rank.ok("add");
    }
    // Out of bounds: past the member, past the object, past the mapping; unaligned.
    assert_eq!(r[1].call(&format!("bindmem {G} {G} {}", 2 * G)), INVALID);
    assert_eq!(r[1].call(&format!("bindmem {} 0 {G}", 2 * G)), INVALID);
    assert_eq!(r[2].call(&format!("bindaddr 0 {G} {}", 2 * G)), INVALID);
    assert_eq!(r[2].call(&format!("bindmem 4096 0 {G}")), INVALID);
    // mc [0,2G) -> rank 0 [0,2G); mc [G,2G) -> rank 1 [G,2G);
    // mc [0,G) -> rank 2 [G,2G) (by address); mc [0,2G) -> rank 3 [0,2G) (by address).
    r[0].ok(&format!("bindmem 0 0 {}", 2 * G));
    r[1].ok(&format!("bindmem {G} {G} {G}"));
    r[2].ok(&format!("bindaddr 0 {G} {G}"));
    r[3].ok(&format!("bindaddr 0 0 {}", 2 * G));
    r[0].ok("map");
    r[2].ok("map");

    r[0].ok(&format!("write {} X1", G + 10));
    assert_eq!(r[0].data(&format!("readmem {} 2", G + 10)), "X1");
    assert_eq!(r[1].data(&format!("readmem {} 2", G + 10)), "X1");
    assert_eq!(r[3].data(&format!("readmem {} 2", G + 10)), "X1");
    assert_eq!(r[2].data(&format!("readmem {} 2", G + 10)), "..");
    assert_eq!(
        r[2].data("readmem 10 2"),
        "..",
        "rank 2 binds only mc [0,G)"
    );

    r[2].ok("write 20 Y2");
    assert_eq!(r[0].data("readmem 20 2"), "Y2");
    assert_eq!(r[2].data(&format!("readmem {} 2", G + 20)), "Y2");
    assert_eq!(r[3].data("readmem 20 2"), "Y2");
    assert_eq!(r[1].data("readmem 20 2"), "..");
    assert_eq!(r[1].data(&format!("readmem {} 2", G + 20)), "..");

    // Reads follow the lowest device still bound there.
    r[0].ok(&format!("poke {} A0", G + 30));
    r[1].ok(&format!("poke {} B1", G + 30));
    r[3].ok(&format!("poke {} D3", G + 30));
    let at = format!("readmc {} 2", G + 30);
    assert_eq!(r[2].data(&at), "A0");
    r[0].ok(&format!("unbind 0 {}", 2 * G));
    assert_eq!(r[2].data(&at), "B1");
    r[1].ok(&format!("unbind {G} {G}"));
    assert_eq!(r[2].data(&at), "D3");
    r[3].ok(&format!("unbind 0 {}", 2 * G));
    assert_eq!(
        r[2].data(&at),
        "D3",
        "nothing bound there: the object's own bytes, last refreshed"
    );
    for rank in r {
        rank.finish();
    }
}

const DEAD: &str = "tests::multicast::a_dead_binders_member_stops_receiving";

/// A binder that dies loses its binding: writes go on for the others, its entry is pruned (so
/// a process on the same device, refused while the binder lived, can now bind the same range),
/// its device stays in the team.
#[test]
fn a_dead_binders_member_stops_receiving() {
    if run_role(DEAD) {
        return;
    }
    let dir = StateDir::new(DEAD);
    let (mut r, name) = group(DEAD, &dir, &[0, 1], G, G);
    for rank in &mut r {
        rank.ok("add");
    }
    for rank in &mut r {
        rank.ok(&format!("bindmem 0 0 {G}"));
    }
    r[0].ok("map");
    r[0].ok("write 0 live");
    assert_eq!(r[1].data("readmem 0 4"), "live");

    // Another process on device 1 cannot bind the range while its binder lives.
    let mut next = Rank::spawn(DEAD, &dir, 1, &[("FAKE_CUDA_DEVICES", "4")]);
    next.ok(&format!("import {name} {G}"));
    next.ok(&format!("mem {G}"));
    assert_eq!(next.call("add"), INVALID, "device 1 is in the team");
    assert_eq!(
        next.call(&format!("bindmem 0 0 {G}")),
        INVALID,
        "overlaps the live binding of device 1"
    );

    r.pop().unwrap().0.kill();
    r[0].ok("write 8 dead");
    assert_eq!(r[0].data("readmem 8 4"), "dead");
    assert_eq!(
        next.call("add"),
        INVALID,
        "device 1 stays in the team after its adder died"
    );
    next.ok(&format!("bindmem 0 0 {G}"));
    r[0].ok("write 16 next");
    assert_eq!(next.data("readmem 16 4"), "next");
    assert_eq!(
        next.data("readmem 8 4"),
        "....",
        "written while nobody bound it"
    );
    next.finish();
    for rank in r {
        rank.finish();
    }
}

const CKPT: &str =
    "tests::multicast::a_process_holding_a_multicast_object_checkpoints_then_cannot_restore";

/// The fake's assumption for the real driver (not measured: multicast never runs on the GPU
/// machine): a process holding a multicast object checkpoints ("succeeds", like a live
/// import), its member stops receiving while it is checkpointed, and its restore fails with
/// NOT_SUPPORTED, leaving it FAILED. The creator fares the same.
#[test]
fn a_process_holding_a_multicast_object_checkpoints_then_cannot_restore() {
    if run_role(CKPT) {
        return;
    }
    let dir = StateDir::new(CKPT);
    let (mut r, _) = group(CKPT, &dir, &[0, 1], G, G);
    for rank in &mut r {
        rank.ok("add");
    }
    for rank in &mut r {
        rank.ok(&format!("bindmem 0 0 {G}"));
        rank.ok("map");
    }
    let mut tool = Tool::spawn(CKPT, &dir, &[]);
    let importer = r[1].0.pid();
    tool.suspend(importer);
    r[0].ok("write 0 ckpt");
    assert_eq!(
        r[0].data("readmem 0 4"),
        "ckpt",
        "the live member still receives"
    );
    assert_eq!(tool.restore(importer, &[]), CUresult::ERROR_NOT_SUPPORTED);
    assert_eq!(tool.state(importer), Ok(process_state::FAILED));
    assert_eq!(r[1].call("add"), CUresult::ERROR_ILLEGAL_STATE, "unusable");

    let creator = r[0].0.pid();
    // (The creator still holds the descriptor it exported, so not `suspend`, which checks
    // that no descriptor of the fake is left.)
    assert_eq!(tool.lock(creator, 0), SUCCESS);
    assert_eq!(tool.checkpoint(creator), SUCCESS);
    assert_eq!(tool.state(creator), Ok(process_state::CHECKPOINTED));
    assert_eq!(tool.restore(creator, &[]), CUresult::ERROR_NOT_SUPPORTED);
    assert_eq!(tool.state(creator), Ok(process_state::FAILED));
    tool.0.finish();
    for rank in r {
        rank.finish();
    }
}
