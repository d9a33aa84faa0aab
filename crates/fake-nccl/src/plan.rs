//! The kernels one all-reduce enqueues, as data: the protocol between ranks lives here, apart from
//! the driver calls that launch it, so it can be checked on the host.
//!
//! Every rank has a ring of `SLOTS` staging slots; collective `seq` (from 1) uses slot
//! `seq % SLOTS` of every rank and that slot's flags `arrived` and `done` (each the last
//! collective that reached that point in the slot; they only grow). Rank `r`, `n` ranks:
//!
//! 1. if `seq > SLOTS`: for every rank `p` (itself included), spin until
//!    `done[p][slot] >= seq - SLOTS`: the slot's previous user, collective `seq - SLOTS`, has been
//!    read by everyone, so the ring is never overwritten under a reader;
//! 2. copy `sendbuff` to `r`'s slot; set `arrived[r][slot] = seq` (a release store, after the copy
//!    on the same stream);
//! 3. for every peer `p`: spin until `arrived[p][slot] >= seq` (it cannot be a later collective's
//!    mark: that one waits at step 1 for this rank's `done`);
//! 4. copy rank 0's slot to `recvbuff`, then add ranks 1..n's slots in rank order: every rank
//!    computes the same `((s0 + s1) + s2) + ...`, so float results are bit-identical everywhere;
//! 5. set `done[r][slot] = seq`.
//!
//! Flags per slot, rather than one counter per rank, keep this right when a rank's collectives
//! run concurrently on several streams: collectives `seq` and `seq + 1` of one rank may then
//! stage, wait and finish in either order. On one stream, step 1 never waits (a rank cannot
//! stage collective `seq` before finishing `seq - 1`, which needed every peer's `seq - 1`
//! staged, so every peer had finished `seq - 2`).
//!
//! A rank's collective completes once its peers have staged their inputs; it does not wait for
//! them to finish reading (real NCCL's ranks also finish a collective at different times). A peer
//! that never calls the collective keeps every other rank's stream busy at step 3.

use crate::abi::Element;
use crate::layout::{Layout, SLOTS};

/// One kernel launch: a built-in kernel of the fake driver (crates/fake-cuda/README.md, "Modules
/// and kernels") and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `cuinterpose_copy(dst, src, bytes)`.
    Copy { dst: u64, src: u64, bytes: u64 },
    /// `cuinterpose_set_u32(flag, value)`.
    Set { flag: u64, value: u32 },
    /// `cuinterpose_spin_until_u32(flag, value)`.
    SpinUntil { flag: u64, value: u32 },
    /// `cuinterpose_sum_u32(dst, src, count)` or `cuinterpose_sum_f32`.
    Sum {
        element: Element,
        dst: u64,
        src: u64,
        count: u64,
    },
}

/// One rank's all-reduce.
#[derive(Clone, Copy, Debug)]
pub struct AllReduce {
    pub layout: Layout,
    /// The region's address in this process.
    pub base: u64,
    pub rank: u32,
    /// The collective's number on this communicator, from 1.
    pub seq: u32,
    pub send: u64,
    pub recv: u64,
    pub count: u64,
    pub element: Element,
}

impl AllReduce {
    /// The kernels to enqueue, in stream order.
    pub fn kernels(&self) -> Vec<Kernel> {
        let Self {
            layout,
            base,
            rank,
            seq,
            ..
        } = *self;
        let seq64 = u64::from(seq);
        let bytes = self.count * self.element.size();
        let slot = |r: u32| base + layout.slot(r, seq64);
        let mut out = Vec::new();
        if seq64 > SLOTS {
            out.extend((0..layout.nranks).map(|p| Kernel::SpinUntil {
                flag: base + layout.done(p, seq64),
                value: seq - SLOTS as u32,
            }));
        }
        out.push(Kernel::Copy {
            dst: slot(rank),
            src: self.send,
            bytes,
        });
        out.push(Kernel::Set {
            flag: base + layout.arrived(rank, seq64),
            value: seq,
        });
        out.extend(
            (0..layout.nranks)
                .filter(|&p| p != rank)
                .map(|p| Kernel::SpinUntil {
                    flag: base + layout.arrived(p, seq64),
                    value: seq,
                }),
        );
        out.push(Kernel::Copy {
            dst: self.recv,
            src: slot(0),
            bytes,
        });
        out.extend((1..layout.nranks).map(|p| Kernel::Sum {
            element: self.element,
            dst: self.recv,
            src: slot(p),
            count: self.count,
        }));
        out.push(Kernel::Set {
            flag: base + layout.done(rank, seq64),
            value: seq,
        });
        out
    }
}

#[cfg(test)]
mod tests;
