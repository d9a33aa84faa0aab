//! Where things lie in a communicator's shared region (the rendezvous file every rank maps).
//!
//! ```text
//! 0                 header: nranks u32 (0 until the first rank claims the file), left u32
//!                   (ranks that destroyed or aborted their communicator)
//! 64 + 64 * r       rank r's line: present u32 (1 once joined), arrived[SLOTS] u32,
//!                   done[SLOTS] u32 (one of each per slot of its ring)
//! slots (4096-aligned)
//!                   rank r's ring: SLOTS slots of SLOT_BYTES, slot (r, i) at
//!                   slots + (r * SLOTS + i) * SLOT_BYTES
//! ```
//!
//! Every flag is on its own rank's 64-byte line, so ranks spinning on different flags do not
//! share a cache line with the one being written.

/// Staging slots per rank: how many collectives a rank may run ahead of its slowest peer.
pub const SLOTS: u64 = 4;
/// Bytes per staging slot: the largest all-reduce (count * element size).
pub const SLOT_BYTES: u64 = 1 << 20;
/// The most ranks a communicator may have (the region of 64 ranks is 256 MiB, sparse).
pub const MAX_RANKS: u32 = 64;

const HEADER_BYTES: u64 = 64;
const LINE_BYTES: u64 = 64;
const PAGE: u64 = 4096;

/// Offsets inside the region of a communicator of `nranks` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nranks: u32,
}

impl Layout {
    pub const NRANKS: u64 = 0;
    pub const LEFT: u64 = 4;

    /// Rank `rank`'s `present` flag.
    pub fn present(self, rank: u32) -> u64 {
        HEADER_BYTES + LINE_BYTES * u64::from(rank)
    }

    /// Rank `rank`'s `arrived` flag for collective `seq`'s slot: the last collective whose
    /// input it has staged in that slot.
    pub fn arrived(self, rank: u32, seq: u64) -> u64 {
        self.present(rank) + 4 + 4 * (seq % SLOTS)
    }

    /// Rank `rank`'s `done` flag for collective `seq`'s slot: the last collective using that
    /// slot for which it has finished reading every rank's slot.
    pub fn done(self, rank: u32, seq: u64) -> u64 {
        self.present(rank) + 4 + 4 * SLOTS + 4 * (seq % SLOTS)
    }

    fn slots(self) -> u64 {
        (HEADER_BYTES + LINE_BYTES * u64::from(self.nranks)).next_multiple_of(PAGE)
    }

    /// Rank `rank`'s staging slot for collective `seq` (counted from 1).
    pub fn slot(self, rank: u32, seq: u64) -> u64 {
        self.slots() + (u64::from(rank) * SLOTS + seq % SLOTS) * SLOT_BYTES
    }

    /// The region's size.
    pub fn size(self) -> u64 {
        self.slots() + u64::from(self.nranks) * SLOTS * SLOT_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_slots_and_ranks_never_overlap() {
        for nranks in [1, 2, 3, 4, 63, MAX_RANKS] {
            let l = Layout { nranks };
            let mut ranges: Vec<(u64, u64)> = vec![(Layout::NRANKS, 4), (Layout::LEFT, 4)];
            for r in 0..nranks {
                ranges.push((l.present(r), 4));
                for seq in 1..=SLOTS {
                    ranges.extend([
                        (l.arrived(r, seq), 4),
                        (l.done(r, seq), 4),
                        (l.slot(r, seq), SLOT_BYTES),
                    ]);
                }
            }
            ranges.sort();
            for pair in ranges.windows(2) {
                assert!(pair[0].0 + pair[0].1 <= pair[1].0, "{nranks}: {pair:?}");
            }
            let last = ranges.last().unwrap();
            assert_eq!(last.0 + last.1, l.size(), "{nranks}");
            assert_eq!(l.slot(0, SLOTS) % PAGE, 0);
        }
    }

    #[test]
    fn the_ring_reuses_a_slot_every_slots_collectives() {
        let l = Layout { nranks: 3 };
        assert_eq!(l.slot(1, 3), l.slot(1, 3 + SLOTS));
        assert_eq!(l.done(1, 3), l.done(1, 3 + SLOTS));
        assert!(
            l.done(1, SLOTS - 1) + 4 <= l.present(2),
            "a rank's flags fit its line"
        );
        assert_ne!(l.slot(1, 3), l.slot(1, 4));
        assert_ne!(l.slot(0, 3), l.slot(1, 3));
    }
}
