//! BLAKE3 of each allocation of a data file, hashed by the I/O workers in parallel.
//!
//! An allocation is streamed in units of a power-of-two size from its start (the last one
//! possibly shorter), and each unit is a complete subtree of the allocation's BLAKE3 tree: a worker
//! computes the unit's chaining value as soon as it holds the bytes, with no ordering among
//! workers, and the allocation's digest is merged from them in the tree's canonical shape at the
//! end. So a digest is exactly BLAKE3 of the allocation's bytes (what the manifest records and
//! `restore --verify-data-first` recomputes with a plain hasher), and hashing runs on every worker
//! at once instead of on one at a time in file order, which held the stream to one core's BLAKE3
//! rate. `blake3::hazmat` panics on a misuse; every call here checks its preconditions first and
//! answers an error instead (this code runs inside the application).

use blake3::CHUNK_LEN;
use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, merge_subtrees_non_root, merge_subtrees_root,
};
use std::sync::Mutex;

/// What a unit contributed: the whole allocation's root hash when the unit is all of it, a
/// subtree's chaining value otherwise.
type Piece = [u8; 32];

/// Why a unit or the digests could not be used (a caller's bug, not a damaged file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("digest of allocation {region}: {reason}")]
pub struct DigestError {
    pub region: usize,
    pub reason: String,
}

/// The digests of one data file's allocations, filled unit by unit from any thread.
#[derive(Debug)]
pub struct TreeDigests {
    unit: usize,
    sizes: Vec<u64>,
    pieces: Mutex<Vec<Vec<Option<Piece>>>>,
}

impl TreeDigests {
    /// Digests of allocations of `sizes` bytes, streamed in units of `unit` bytes (a power of
    /// two, at least one BLAKE3 chunk).
    pub fn new(sizes: impl IntoIterator<Item = u64>, unit: usize) -> TreeDigests {
        assert!(
            unit.is_power_of_two() && unit >= CHUNK_LEN,
            "a unit must be a whole BLAKE3 subtree"
        );
        let sizes: Vec<u64> = sizes.into_iter().collect();
        let pieces = sizes
            .iter()
            .map(|&size| vec![None; units_in(size, unit)])
            .collect();
        TreeDigests {
            unit,
            sizes,
            pieces: Mutex::new(pieces),
        }
    }

    /// Hashes `bytes`, the unit at byte `offset` of allocation `region`.
    pub fn add(&self, region: usize, offset: u64, bytes: &[u8]) -> Result<(), DigestError> {
        let fail = |reason: String| DigestError { region, reason };
        let size = *self
            .sizes
            .get(region)
            .ok_or_else(|| fail("no such allocation".into()))?;
        let unit = self.unit as u64;
        if !offset.is_multiple_of(unit) || offset >= size {
            return Err(fail(format!("no unit starts at offset {offset}")));
        }
        let expected = unit.min(size - offset);
        if bytes.len() as u64 != expected {
            return Err(fail(format!(
                "the unit at offset {offset} has {} bytes, not {expected}",
                bytes.len()
            )));
        }
        let index = usize::try_from(offset / unit).map_err(|e| fail(e.to_string()))?;
        let piece = if size <= unit {
            *blake3::hash(bytes).as_bytes()
        } else {
            // A subtree at a multiple of a power-of-two unit, at most a unit long: within the
            // bounds `set_input_offset` and `update` assert.
            let mut hasher = blake3::Hasher::new();
            hasher.set_input_offset(offset);
            hasher.update(bytes);
            hasher.finalize_non_root()
        };
        let mut pieces = self.pieces.lock().unwrap_or_else(|e| e.into_inner());
        let slot = pieces
            .get_mut(region)
            .and_then(|r| r.get_mut(index))
            .ok_or_else(|| fail(format!("no unit {index}")))?;
        *slot = Some(piece);
        Ok(())
    }

    /// Every allocation's BLAKE3, once each of its units was added.
    pub fn finish(self) -> Result<Vec<[u8; 32]>, DigestError> {
        let pieces = self.pieces.into_inner().unwrap_or_else(|e| e.into_inner());
        pieces
            .into_iter()
            .enumerate()
            .map(|(region, units)| {
                let units: Vec<Piece> = units
                    .into_iter()
                    .enumerate()
                    .map(|(i, p)| {
                        p.ok_or_else(|| DigestError {
                            region,
                            reason: format!("unit {i} was never hashed"),
                        })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(merge(&units))
            })
            .collect()
    }
}

fn units_in(size: u64, unit: usize) -> usize {
    usize::try_from(size.div_ceil(unit as u64)).unwrap_or(usize::MAX)
}

/// The root of a tree whose leaves are `units` (in order; each but the last a subtree of the same
/// power-of-two size), merged as BLAKE3's own incremental hasher does: before a unit is pushed,
/// completed subtrees are merged while the stack holds more entries than the number of units
/// before it has one bits; at the end the stack is merged from the top, the last merge as root.
fn merge(units: &[Piece]) -> [u8; 32] {
    let mut stack: Vec<ChainingValue> = Vec::new();
    for (before, cv) in units.iter().enumerate() {
        while stack.len() > before.count_ones() as usize {
            merge_top(&mut stack);
        }
        stack.push(*cv);
    }
    let Some(mut right) = stack.pop() else {
        return *blake3::hash(&[]).as_bytes();
    };
    let Some(mut left) = stack.pop() else {
        return right; // one unit: it is the root hash of the whole allocation
    };
    while let Some(next) = stack.pop() {
        right = merge_subtrees_non_root(&left, &right, Mode::Hash);
        left = next;
    }
    *merge_subtrees_root(&left, &right, Mode::Hash).as_bytes()
}

fn merge_top(stack: &mut Vec<ChainingValue>) {
    if let (Some(right), Some(left)) = (stack.pop(), stack.pop()) {
        stack.push(merge_subtrees_non_root(&left, &right, Mode::Hash));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt) ^ (i >> 10) as u8)
            .collect()
    }

    fn digest_in_units(data: &[u8], unit: usize, reverse: bool) -> [u8; 32] {
        let digests = TreeDigests::new([data.len() as u64], unit);
        let mut offsets: Vec<usize> = (0..data.len()).step_by(unit).collect();
        if reverse {
            offsets.reverse();
        }
        for at in offsets {
            let end = (at + unit).min(data.len());
            digests.add(0, at as u64, &data[at..end]).unwrap();
        }
        digests.finish().unwrap()[0]
    }

    #[test]
    fn units_hashed_in_any_order_give_blake3_of_the_whole() {
        for unit in [CHUNK_LEN, 2 * CHUNK_LEN, 4 * CHUNK_LEN] {
            for units in 0..=17 {
                for extra in [0, 1, CHUNK_LEN - 1, CHUNK_LEN, CHUNK_LEN + 1, unit - 1] {
                    let len = units * unit + extra;
                    if len == 0 {
                        continue;
                    }
                    let data = bytes(len, units as u8);
                    let whole = *blake3::hash(&data).as_bytes();
                    for reverse in [false, true] {
                        assert_eq!(
                            digest_in_units(&data, unit, reverse),
                            whole,
                            "{len} bytes in units of {unit}, reversed: {reverse}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_data_file_unit_gives_blake3_of_the_whole() {
        let unit = crate::datafile::IO_SIZE;
        let data = bytes(3 * unit + unit / 2 + 4096, 7);
        assert_eq!(
            digest_in_units(&data, unit, true),
            *blake3::hash(&data).as_bytes()
        );
    }

    #[test]
    fn several_allocations_and_an_empty_one() {
        let a = bytes(5 * CHUNK_LEN + 3, 1);
        let b = bytes(CHUNK_LEN / 2, 2);
        let digests = TreeDigests::new([a.len() as u64, 0, b.len() as u64], 2 * CHUNK_LEN);
        for at in (0..a.len()).step_by(2 * CHUNK_LEN) {
            let end = (at + 2 * CHUNK_LEN).min(a.len());
            digests.add(0, at as u64, &a[at..end]).unwrap();
        }
        digests.add(2, 0, &b).unwrap();
        assert_eq!(
            digests.finish().unwrap(),
            vec![
                *blake3::hash(&a).as_bytes(),
                *blake3::hash(&[]).as_bytes(),
                *blake3::hash(&b).as_bytes()
            ]
        );
    }

    #[test]
    fn misuse_is_an_error_not_a_panic() {
        let digests = TreeDigests::new([4 * CHUNK_LEN as u64], CHUNK_LEN);
        let unit = bytes(CHUNK_LEN, 0);
        assert!(digests.add(1, 0, &unit).is_err(), "no such allocation");
        assert!(digests.add(0, 512, &unit).is_err(), "not at a unit");
        assert!(
            digests.add(0, 4 * CHUNK_LEN as u64, &unit).is_err(),
            "past the end"
        );
        assert!(digests.add(0, 0, &unit[..100]).is_err(), "short unit");
        digests.add(0, 0, &unit).unwrap();
        let e = digests.finish().unwrap_err();
        assert!(e.reason.contains("unit 1 was never hashed"), "{e}");
    }
}
