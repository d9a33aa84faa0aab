//! The kernels one all-reduce enqueues, as data: the protocol between ranks lives here, apart from
//! the driver calls that launch it, so it can be checked on the host.
//!
//! Rank `r`'s collective number `seq` (from 1), with `n` ranks, `base` the region's address:
//!
//! 1. if `seq > SLOTS`: for every peer `p`, spin until `done[p] >= seq - SLOTS` -- slot
//!    `seq % SLOTS` was last used by collective `seq - SLOTS`, and a peer sets `done` only after
//!    it has read every slot of that collective, so the ring is never overwritten under a reader;
//! 2. copy `sendbuff` to `r`'s slot; set `arrived[r] = seq` (a release store, after the copy on
//!    the same stream);
//! 3. for every peer `p`: spin until `arrived[p] >= seq`;
//! 4. copy rank 0's slot to `recvbuff`, then add ranks 1..n's slots in rank order: every rank
//!    computes the same `((s0 + s1) + s2) + ...`, so float results are bit-identical everywhere;
//! 5. set `done[r] = seq`.
//!
//! A rank's collective thus completes once its peers have staged their inputs; it does not wait
//! for them to finish reading (real NCCL's ranks also finish a collective at different times).
//! A peer that never calls the collective keeps every other rank's stream busy at step 3, and a
//! rank more than `SLOTS` collectives ahead of a peer waits at step 1.

use crate::abi::Element;
use crate::layout::{Layout, SLOTS};

/// One kernel launch: a built-in kernel of the fake driver (KERNELS.md) and its arguments.
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
        let peers = (0..layout.nranks).filter(|&p| p != rank);
        let bytes = self.count * self.element.size();
        let slot = |r: u32| base + layout.slot(r, u64::from(seq));
        let mut out = Vec::new();
        if u64::from(seq) > SLOTS {
            let reused = seq - SLOTS as u32;
            out.extend(peers.clone().map(|p| Kernel::SpinUntil {
                flag: base + layout.done(p),
                value: reused,
            }));
        }
        out.push(Kernel::Copy {
            dst: slot(rank),
            src: self.send,
            bytes,
        });
        out.push(Kernel::Set {
            flag: base + layout.arrived(rank),
            value: seq,
        });
        out.extend(peers.map(|p| Kernel::SpinUntil {
            flag: base + layout.arrived(p),
            value: seq,
        }));
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
            flag: base + layout.done(rank),
            value: seq,
        });
        out
    }
}

#[cfg(test)]
mod tests;
