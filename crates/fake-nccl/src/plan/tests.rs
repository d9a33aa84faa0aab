//! The protocol run on the host: each rank's kernels executed in order by one thread (its
//! stream), as the fake driver executes them, over one shared region, with random pauses between
//! kernels so ranks interleave differently on every run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::*;

/// Host memory standing in for the shared region, u64-aligned.
struct Region {
    words: Vec<u64>,
    nranks: u32,
}

impl Region {
    fn new(layout: Layout) -> Region {
        Region {
            words: vec![0; (layout.size() / 8) as usize],
            nranks: layout.nranks,
        }
    }

    fn base(&self) -> u64 {
        self.words.as_ptr() as u64
    }
}

fn flag(addr: u64) -> &'static AtomicU32 {
    // SAFETY: every flag address the plans name lies inside a live, 4-aligned test region that
    // outlives the threads using it, and is only accessed atomically.
    unsafe { AtomicU32::from_ptr(addr as *mut u32) }
}

/// What the fake driver does when a stream reaches the kernel.
fn execute(kernel: &Kernel) {
    match *kernel {
        Kernel::Copy { dst, src, bytes } => {
            // SAFETY: both ranges are test buffers or slots of a live region; the protocol
            // orders this copy after the writes of the slot it reads (the flag it spun on).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes as usize) }
        }
        Kernel::Set { flag: f, value } => flag(f).store(value, Ordering::Release),
        Kernel::SpinUntil { flag: f, value } => {
            while flag(f).load(Ordering::Acquire) < value {
                std::thread::yield_now();
            }
        }
        Kernel::Sum {
            element,
            dst,
            src,
            count,
        } => {
            for i in 0..count as usize {
                // SAFETY: `count` elements of both lie in test buffers or slots, as above.
                let d = unsafe { (dst as *mut u32).add(i) };
                // SAFETY: as above.
                let s = unsafe { (src as *const u32).add(i) };
                // SAFETY: as above; u32 and f32 share size and alignment.
                let a = unsafe { d.read() };
                // SAFETY: as above.
                let b = unsafe { s.read() };
                let sum = match element {
                    Element::U32 => a.wrapping_add(b),
                    Element::F32 => (f32::from_bits(a) + f32::from_bits(b)).to_bits(),
                };
                // SAFETY: as above.
                unsafe { d.write(sum) };
            }
        }
    }
}

/// A small deterministic generator per rank, so a failing interleaving can be rerun.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

const COUNT: usize = 257;

fn input(rank: u32, seq: u32, i: usize, element: Element) -> u32 {
    match element {
        Element::U32 => (rank + 1)
            .wrapping_mul(0x9e37_79b9)
            .wrapping_add(seq << 16)
            .wrapping_add(i as u32),
        // Not exactly representable sums: the order of additions shows in the bits.
        Element::F32 => (0.1 * (rank + 1) as f32 + seq as f32 * 1.37 + i as f32 / 3.0).to_bits(),
    }
}

/// One stream of one rank: executes collectives `seqs` in order, pausing at random.
fn stream(
    region: &Region,
    rank: u32,
    seqs: Vec<u32>,
    element: Element,
    seed: u64,
) -> Vec<(u32, Vec<u32>)> {
    let layout = Layout {
        nranks: region.nranks,
    };
    let mut rng = Lcg(seed);
    let mut bufs: Vec<(u32, Vec<u32>, Vec<u32>)> = seqs
        .into_iter()
        .map(|seq| {
            let send = (0..COUNT).map(|i| input(rank, seq, i, element)).collect();
            (seq, send, vec![0; COUNT])
        })
        .collect();
    for (seq, send, recv) in &mut bufs {
        let plan = AllReduce {
            layout,
            base: region.base(),
            rank,
            seq: *seq,
            send: send.as_ptr() as u64,
            recv: recv.as_mut_ptr() as u64,
            count: COUNT as u64,
            element,
        };
        for kernel in plan.kernels() {
            if rng.next().is_multiple_of(4) {
                std::thread::sleep(Duration::from_micros(rng.next() % 300));
            }
            execute(&kernel);
        }
    }
    bufs.into_iter().map(|(seq, _, recv)| (seq, recv)).collect()
}

/// Runs `collectives` all-reduces on `nranks` ranks, each rank's collectives dealt round-robin
/// to `streams` threads (its streams) and enqueued at once (distinct buffers); returns every
/// rank's results in collective order.
fn run(
    nranks: u32,
    streams: u32,
    collectives: u32,
    element: Element,
    seed: u64,
) -> Vec<Vec<Vec<u32>>> {
    let region = Arc::new(Region::new(Layout { nranks }));
    let threads: Vec<(u32, _)> = (0..nranks)
        .flat_map(|rank| (0..streams).map(move |s| (rank, s)))
        .map(|(rank, s)| {
            let region = Arc::clone(&region);
            let seqs = (1..=collectives).filter(|seq| seq % streams == s).collect();
            let seed = seed ^ (u64::from(rank * streams + s) * 7919);
            (
                rank,
                std::thread::spawn(move || stream(&region, rank, seqs, element, seed)),
            )
        })
        .collect();
    let mut results = vec![vec![Vec::new(); collectives as usize]; nranks as usize];
    for (rank, thread) in threads {
        for (seq, recv) in thread.join().unwrap() {
            results[rank as usize][seq as usize - 1] = recv;
        }
    }
    results
}

fn expected(nranks: u32, seq: u32, i: usize, element: Element) -> u32 {
    let mut acc = input(0, seq, i, element);
    for r in 1..nranks {
        let v = input(r, seq, i, element);
        acc = match element {
            Element::U32 => acc.wrapping_add(v),
            Element::F32 => (f32::from_bits(acc) + f32::from_bits(v)).to_bits(),
        };
    }
    acc
}

#[test]
fn every_rank_gets_the_sum_in_rank_order_while_ranks_run_ahead() {
    for (nranks, streams, element, seed) in [
        (2, 1, Element::U32, 1),
        (3, 1, Element::F32, 2),
        (4, 1, Element::U32, 3),
        (2, 2, Element::U32, 4),
        (3, 3, Element::F32, 5),
        (4, 2, Element::F32, 6),
    ] {
        let collectives = 4 * SLOTS as u32 + 1;
        let results = run(nranks, streams, collectives, element, seed);
        for (rank, per_rank) in results.iter().enumerate() {
            for (index, recv) in per_rank.iter().enumerate() {
                let seq = index as u32 + 1;
                for (i, &got) in recv.iter().enumerate() {
                    assert_eq!(
                        got,
                        expected(nranks, seq, i, element),
                        "{nranks} ranks, {streams} streams, {element:?}: rank {rank} \
                         collective {seq} element {i}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_single_rank_copies_its_input() {
    let results = run(1, 2, 3, Element::F32, 5);
    assert_eq!(results[0][2][7], input(0, 3, 7, Element::F32));
}

#[test]
fn in_place_reduces_into_the_send_buffer() {
    let layout = Layout { nranks: 2 };
    let region = Region::new(layout);
    let mut bufs = [vec![1u32, 2, 3], vec![10u32, 20, 30]];
    let plans: Vec<Vec<Kernel>> = (0..2)
        .map(|rank| {
            let p = bufs[rank].as_mut_ptr() as u64;
            AllReduce {
                layout,
                base: region.base(),
                rank: rank as u32,
                seq: 1,
                send: p,
                recv: p,
                count: 3,
                element: Element::U32,
            }
            .kernels()
        })
        .collect();
    // Rank 0 up to its spin, all of rank 1, then the rest of rank 0: a valid interleaving.
    let spin = plans[0]
        .iter()
        .position(|k| matches!(k, Kernel::SpinUntil { .. }))
        .unwrap();
    plans[0][..spin].iter().for_each(execute);
    plans[1].iter().for_each(execute);
    plans[0][spin..].iter().for_each(execute);
    assert_eq!(bufs, [vec![11, 22, 33], vec![11, 22, 33]]);
}

/// Runs rank 0 of two ranks over `collectives` collectives on a thread; returns how many it has
/// completed, live.
fn rank0_alone(region: &Arc<Region>, collectives: u32) -> Arc<AtomicU64> {
    let layout = Layout { nranks: 2 };
    let completed = Arc::new(AtomicU64::new(0));
    let (region, progress) = (Arc::clone(region), Arc::clone(&completed));
    std::thread::spawn(move || {
        let (send, mut recv) = (vec![1u32; 4], vec![0u32; 4]);
        for seq in 1..=collectives {
            let plan = AllReduce {
                layout,
                base: region.base(),
                rank: 0,
                seq,
                send: send.as_ptr() as u64,
                recv: recv.as_mut_ptr() as u64,
                count: 4,
                element: Element::U32,
            };
            plan.kernels().iter().for_each(execute);
            progress.fetch_add(1, Ordering::SeqCst);
        }
    });
    completed
}

fn settles_at(progress: &AtomicU64, value: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while progress.load(Ordering::SeqCst) < value && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(progress.load(Ordering::SeqCst), value);
}

#[test]
fn a_rank_waits_for_a_peer_that_has_not_called_the_collective() {
    let layout = Layout { nranks: 2 };
    let region = Arc::new(Region::new(layout));
    let progress = rank0_alone(&region, 1);
    settles_at(&progress, 0);
    // The peer stages its input (what its kernels' first steps do): rank 0 completes.
    flag(region.base() + layout.arrived(1, 1)).store(1, Ordering::Release);
    settles_at(&progress, 1);
}

#[test]
fn a_rank_runs_at_most_slots_collectives_ahead_of_a_reader() {
    let layout = Layout { nranks: 2 };
    let region = Arc::new(Region::new(layout));
    // The peer's inputs are staged in every slot but it has read none: rank 0 completes a
    // ring's worth and may then reuse a slot only once the peer is done with it.
    for seq in 1..=SLOTS {
        flag(region.base() + layout.arrived(1, seq)).store(100, Ordering::Release);
    }
    let progress = rank0_alone(&region, 2 * SLOTS as u32);
    settles_at(&progress, SLOTS);
    flag(region.base() + layout.done(1, 1)).store(1, Ordering::Release);
    settles_at(&progress, SLOTS + 1);
    for seq in 2..=SLOTS {
        flag(region.base() + layout.done(1, seq)).store(seq as u32, Ordering::Release);
    }
    settles_at(&progress, 2 * SLOTS);
}

#[test]
fn launches_per_collective() {
    for nranks in [1u32, 2, 4] {
        let plan = |seq| AllReduce {
            layout: Layout { nranks },
            base: 0x1000,
            rank: 0,
            seq,
            send: 0x10,
            recv: 0x20,
            count: 1,
            element: Element::U32,
        };
        let n = nranks as usize;
        assert_eq!(plan(SLOTS as u32).kernels().len(), 2 * n + 2, "{nranks}");
        assert_eq!(
            plan(SLOTS as u32 + 1).kernels().len(),
            3 * n + 2,
            "{nranks}"
        );
    }
}
