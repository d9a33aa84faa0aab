//! Byte stores: where Save puts the bytes of this process's allocations and Load takes them back
//! from, behind one interface ([`ByteStore`]).
//!
//! - [`carrier::Carrier`]: this process's own host carrier, filled and drained by the copy engine
//!   in process (Save, SaveKeepingContexts, and the Load after them).
//! - [`helper::Helper`]: this process's carrier in the carrier helper, which imports each
//!   allocation and runs the copy engine there (SaveThroughHelper, and the Load after it).
//! - [`datafile::DataFile`]: a data file or a block store the tool opened in the checkpoint
//!   directory, streamed by [`crate::datafile`] (SaveTo, LoadFrom).
//!
//! [`Capture::save`] and [`Capture::load`] run the two phases over any store, and what every
//! store shares is written here once: which allocations are saved ([`Tracking::save_items`]),
//! mapping them temporarily under their device's context with the maps dropped again on an error
//! ([`Tracking::map_for_copy`]), and after a copy dropping the maps, or keeping them while a copy
//! may still run ([`Tracking::unmap_after_copy`]). Load's fresh allocations are made and mapped by
//! [`rebuild`]. A store says where each allocation goes, moves the bytes and records what
//! Load will need.
//!
//! State: none of its own here; the stores keep theirs in [`crate::capture::Control`] (the
//! carrier, what the helper handed over, the data file's record) and the carrier offsets in the
//! registry's records.

pub(crate) mod carrier;
pub(crate) mod datafile;
pub(crate) mod helper;
pub(crate) mod rebuild;

use crate::capture::{Capture, PhaseError, check};
use crate::log::log_warn;
use crate::registry::VHandle;
use crate::track::Tracking;
use cuda::DriverHandle;
use cuda_abi::{CUmemAccessDesc, CUmemLocation, access_flags, location_type};
use protocol::record::{AllocationId, Phase};
use rebuild::LoadItem;

/// A shim-owned mapping of a whole allocation, for copying: unmapped and its range freed on
/// drop, which happens under the device's context ([`Tracking::unmap_after_copy`]), or leaked
/// while a copy may still use it.
pub(crate) type TempMap<'a> = cuda::owned::Mapping<'a>;

/// An allocation mapped for a copy: its temporary mapping, the device whose context copies it,
/// and where its bytes lie in the store.
pub(crate) type Mapped<'a, P> = (TempMap<'a>, i32, P);

/// One allocation Save copies out.
pub(crate) struct SaveItem {
    pub(crate) handle: VHandle,
    pub(crate) id: AllocationId,
    pub(crate) real: DriverHandle,
    pub(crate) size: usize,
    pub(crate) device: i32,
}

/// Where Save puts the bytes and Load takes them back from.
pub(crate) trait ByteStore {
    /// Where one allocation's bytes lie in the store: an offset in a carrier, an extent of a
    /// data file.
    type Place: Copy;
    /// What a fill reports.
    type Stats;
    /// What Save and Load answer: the bytes moved and the store's figures.
    type Outcome;
    /// The request that saves into the store, as a refusal names it.
    const SAVE: &'static str;
    /// The request that loads from it.
    const LOAD: &'static str;

    /// Copies `items` (every allocation this process created, in handle order) into the store
    /// and records where each went. The phase becomes Saved when it succeeds.
    fn save(
        &self,
        t: &Tracking,
        c: &Capture,
        items: Vec<SaveItem>,
    ) -> Result<Self::Outcome, PhaseError>;

    /// Refuses a Load that must not read this store, before anything changes.
    fn check_load(&self, _c: &Capture) -> Result<(), PhaseError> {
        Ok(())
    }

    /// Where the bytes of a released creation are (`None`: it was not saved here).
    fn place(&self, item: &LoadItem) -> Option<Self::Place>;

    /// Fills the fresh allocations of a Load, mapped in `work`.
    fn fill(
        &self,
        t: &Tracking,
        c: &Capture,
        work: &[Mapped<'_, Self::Place>],
    ) -> Result<Self::Stats, PhaseError>;

    /// Whether a copy of this store may still be running (it could not be confirmed finished):
    /// its mappings and the fresh allocations of a failed Load are then kept.
    fn in_doubt(&self, c: &Capture) -> bool;

    /// Load's answer from what the rebuild loaded (`None`: everything was loaded already).
    fn loaded(&self, c: &Capture, rebuilt: Option<(u64, Self::Stats)>) -> Self::Outcome;
}

impl Capture {
    /// Save into `store` (Save, SaveKeepingContexts, SaveThroughHelper, SaveTo). The allocations
    /// stay live: Release lets them go.
    pub(crate) fn save<S: ByteStore>(
        &self,
        t: &Tracking,
        store: &S,
    ) -> Result<S::Outcome, PhaseError> {
        t.expect_phase(S::SAVE, &[Phase::Frozen])?;
        let outcome = store.save(t, self, t.save_items())?;
        t.set_phase(Phase::Saved);
        Ok(outcome)
    }

    /// Load from `store` (Load, LoadFrom): every released creation is made again, filled from
    /// the store, mapped and published ([`Tracking::rebuild_creations`]).
    pub(crate) fn load<S: ByteStore>(
        &self,
        t: &Tracking,
        store: &S,
    ) -> Result<S::Outcome, PhaseError> {
        store.check_load(self)?;
        let rebuilt = t.rebuild_creations(
            S::LOAD,
            |item| store.place(item),
            |work| {
                let filled = store.fill(t, self, &work);
                t.unmap_after_copy(work, store.in_doubt(self));
                filled
            },
            || store.in_doubt(self),
        )?;
        Ok(store.loaded(self, rebuilt))
    }
}

/// The preparation every store shares: the items and their temporary mappings.
impl Tracking {
    /// The allocations Save copies out, in handle order: the one place that says which.
    pub(crate) fn save_items(&self) -> Vec<SaveItem> {
        let reg = self.lock();
        let mut v: Vec<_> = reg
            .objects()
            .filter(|(_, o)| o.is_creation())
            .filter_map(|(h, o)| Some((h, o.id()?, o.real?, o.size as usize, o.props)))
            .collect();
        v.sort_by_key(|(h, ..)| *h);
        drop(reg);
        v.into_iter()
            .map(|(handle, id, real, size, props)| SaveItem {
                handle,
                id,
                real,
                size,
                device: self.copy_device(&props),
            })
            .collect()
    }

    /// The device whose context copies an allocation and which gets access to its temporary
    /// mapping: its location for device memory, else the first device the process used.
    pub(crate) fn copy_device(&self, props: &protocol::record::AllocationProps) -> i32 {
        if props.location_type == location_type::DEVICE {
            props.location_id
        } else {
            self.lock().devices().first().copied().unwrap_or(0)
        }
    }

    /// Maps each of `items` temporarily under its device's context, beside where its bytes go;
    /// on an error the maps made so far are dropped again.
    pub(crate) fn map_for_copy<P: Copy>(
        &self,
        items: &[SaveItem],
        places: &[P],
    ) -> Result<Vec<Mapped<'_, P>>, PhaseError> {
        let mut work = Vec::with_capacity(items.len());
        for (item, place) in items.iter().zip(places) {
            let mapped = copy::enter(&self.real, item.device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| self.temp_map(item.real, item.size, item.device));
            match mapped {
                Ok(map) => work.push((map, item.device, *place)),
                Err(e) => {
                    self.unmap_after_copy(work, false);
                    return Err(e);
                }
            }
        }
        Ok(work)
    }

    /// A temporary read-write mapping of the whole allocation `real` for `device`.
    pub(crate) fn temp_map(
        &self,
        real: DriverHandle,
        size: usize,
        device: i32,
    ) -> Result<TempMap<'_>, PhaseError> {
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: location_type::DEVICE,
                id: device,
            },
            flags: access_flags::PROT_READWRITE,
        };
        check(
            || format!("a temporary mapping of {size} bytes"),
            TempMap::whole(&self.real, real, size, &[desc], copy::log_cleanup),
        )
    }

    /// Removes temporary mappings under their device's context, or, `in_doubt` (a copy may still
    /// read or write them), leaks them. One whose context cannot be entered is kept (never
    /// unmapped without its context).
    pub(crate) fn unmap_after_copy<'a, T>(
        &self,
        work: impl IntoIterator<Item = (TempMap<'a>, i32, T)>,
        in_doubt: bool,
    ) {
        for (map, device, _) in work {
            if in_doubt {
                map.leak();
                continue;
            }
            match copy::enter(&self.real, device) {
                Ok(_ctx) => drop(map),
                Err(e) => {
                    log_warn!("temporary mapping kept: {e}");
                    map.leak();
                }
            }
        }
    }
}
