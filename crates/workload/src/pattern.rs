//! Deterministic byte patterns: what `fill` writes and `verify` checks.
//!
//! The byte at pattern position `p` for seed `s` is byte `p % 8` (little endian) of
//! `splitmix64(splitmix64(s) ^ (p / 8))`. Positions, not addresses, select the bytes, so a process
//! that maps the same allocation at another address (or at another offset) can check what a peer
//! wrote by naming the same seed and position.

/// One step of the splitmix64 generator: a cheap, well-mixed 64-bit hash.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The pattern of one seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    key: u64,
}

impl Pattern {
    /// The pattern of `seed`.
    pub fn new(seed: u64) -> Pattern {
        Pattern {
            key: splitmix64(seed),
        }
    }

    fn word(self, index: u64) -> [u8; 8] {
        splitmix64(self.key ^ index).to_le_bytes()
    }

    /// The byte at pattern position `position`.
    pub fn byte(self, position: u64) -> u8 {
        let word = self.word(position / 8);
        // The index is below 8 by construction.
        word[(position % 8) as usize]
    }

    /// Writes the pattern for positions `start..start + buf.len()` into `buf`.
    pub fn fill(self, start: u64, buf: &mut [u8]) {
        let mut position = start;
        let mut rest = buf;
        while !rest.is_empty() {
            let word = self.word(position / 8);
            let skip = (position % 8) as usize;
            let n = (8 - skip).min(rest.len());
            let (head, tail) = rest.split_at_mut(n);
            head.copy_from_slice(&word[skip..skip + n]);
            rest = tail;
            position += n as u64;
        }
    }

    /// The index of the first byte of `buf` that differs from the pattern for positions starting at
    /// `start`, if any.
    pub fn first_mismatch(self, start: u64, buf: &[u8]) -> Option<usize> {
        let mut position = start;
        let mut checked = 0usize;
        let mut rest = buf;
        while !rest.is_empty() {
            let word = self.word(position / 8);
            let skip = (position % 8) as usize;
            let n = (8 - skip).min(rest.len());
            let (head, tail) = rest.split_at(n);
            if head != &word[skip..skip + n] {
                let at = head
                    .iter()
                    .zip(&word[skip..skip + n])
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Some(checked + at);
            }
            rest = tail;
            checked += n;
            position += n as u64;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_agrees_with_byte_at_any_start() {
        let p = Pattern::new(42);
        for start in [0u64, 1, 7, 8, 13, 4096] {
            let mut buf = vec![0u8; 37];
            p.fill(start, &mut buf);
            for (i, b) in buf.iter().enumerate() {
                assert_eq!(*b, p.byte(start + i as u64), "start {start} index {i}");
            }
            assert_eq!(p.first_mismatch(start, &buf), None);
        }
    }

    #[test]
    fn first_mismatch_finds_the_first_changed_byte() {
        let p = Pattern::new(7);
        let mut buf = vec![0u8; 100];
        p.fill(3, &mut buf);
        buf[41] ^= 0xff;
        buf[77] ^= 0x01;
        assert_eq!(p.first_mismatch(3, &buf), Some(41));
    }

    #[test]
    fn seeds_differ() {
        let mut a = vec![0u8; 64];
        let mut b = vec![0u8; 64];
        Pattern::new(1).fill(0, &mut a);
        Pattern::new(2).fill(0, &mut b);
        assert_ne!(a, b);
        assert!(Pattern::new(2).first_mismatch(0, &a).is_some());
    }
}
