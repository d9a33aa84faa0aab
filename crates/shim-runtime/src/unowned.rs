//! Device memory the shim does not own, counted so that `inspect` can say what still goes through
//! the driver's own checkpoint (2-6 GB/s on the H200, against the carriers' 35-55) and what a
//! keep-mode suspend leaves resident: `cuMemAlloc` made by the driver (`CUINTERPOSE_ALLOC=native`),
//! `cuMemAllocPitch`, `cuMemAllocManaged` and `cuMemAllocAsync` memory, by base address.
//!
//! These calls go to the driver unchanged and are not gated (their memory is the native
//! checkpoint's); the shim only records what succeeded and forgets it when `cuMemFree` or
//! `cuMemFreeAsync` of its base succeeds. Not counted: memory of explicit pools
//! (`cuMemAllocFromPoolAsync`), what a pool keeps reserved beyond its live allocations, arrays,
//! graph memory nodes, and the driver's own (contexts, modules).
//!
//! State: [`UnownedAllocs`], the live ones by base address.

use crate::Real;
use cuda_abi::{CUdeviceptr, CUresult};
pub use protocol::record::UnownedKind;
use protocol::record::UnownedRecord;
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// The live unowned allocations by base address: kind and requested bytes. Its lock is a leaf:
/// never held across a driver call or while another lock is taken.
#[derive(Debug, Default)]
pub struct UnownedAllocs(Mutex<BTreeMap<CUdeviceptr, (UnownedKind, u64)>>);

impl UnownedAllocs {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<CUdeviceptr, (UnownedKind, u64)>> {
        // A panic while holding it leaves the map consistent (single inserts and removes).
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Per kind, the number of live allocations and their bytes; kinds with none left out.
    pub fn summary(&self) -> Vec<UnownedRecord> {
        let mut by_kind: BTreeMap<UnownedKind, (u64, u64)> = BTreeMap::new();
        for (kind, bytes) in self.lock().values() {
            let entry = by_kind.entry(*kind).or_default();
            entry.0 += 1;
            entry.1 += bytes;
        }
        by_kind
            .into_iter()
            .map(|(kind, (allocations, bytes))| UnownedRecord {
                kind,
                allocations,
                bytes,
            })
            .collect()
    }
}

impl UnownedAllocs {
    /// The driver made `bytes` of `kind` at `base` (the call succeeded).
    pub fn note_unowned(&self, kind: UnownedKind, base: CUdeviceptr, bytes: u64) {
        self.lock().insert(base, (kind, bytes));
    }

    /// The driver freed the allocation at `base` (a `cuMemFree` or `cuMemFreeAsync` succeeded).
    pub fn note_unowned_freed(&self, base: CUdeviceptr) {
        self.lock().remove(&base);
    }

    /// `cuMemAlloc` left to the driver (`CUINTERPOSE_ALLOC=native`), counted.
    pub(crate) fn driver_mem_alloc(
        &self,
        real: &Real,
        bytes: usize,
    ) -> Result<CUdeviceptr, CUresult> {
        let base = real.mem_alloc(bytes).map_err(|e| e.result)?;
        self.note_unowned(UnownedKind::DriverAlloc, base, bytes as u64);
        Ok(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_counts_live_allocations_per_kind() {
        let u = UnownedAllocs::default();
        u.lock().insert(0x1000, (UnownedKind::Managed, 10));
        u.lock().insert(0x2000, (UnownedKind::Managed, 5));
        u.lock().insert(0x3000, (UnownedKind::StreamOrdered, 7));
        u.lock().remove(&0x1000);
        assert_eq!(
            u.summary(),
            vec![
                UnownedRecord {
                    kind: UnownedKind::Managed,
                    allocations: 1,
                    bytes: 5
                },
                UnownedRecord {
                    kind: UnownedKind::StreamOrdered,
                    allocations: 1,
                    bytes: 7
                },
            ]
        );
        assert!(UnownedAllocs::default().summary().is_empty());
    }
}
