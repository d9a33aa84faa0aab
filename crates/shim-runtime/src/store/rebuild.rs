//! Load's rebuild of this process's creations: each released one made again with its recorded
//! properties and mapped temporarily for its store to fill ([`Tracking::rebuild_creations`]),
//! then mapped at its recorded addresses with its recorded access, exported again into the export
//! cache when it is shared, and published (the application's virtual handle names the new driver
//! handle). Import and the multicast steps map what they rebuild the same way
//! ([`Tracking::map_recorded`]).
//!
//! State: none of its own; it reads and writes the registry's records and the export cache.

use super::TempMap;
use crate::capture::{PhaseError, check};
use crate::log::log_warn;
use crate::registry::{Kind, Mapping, VHandle, driver_props};
use crate::track::{Tracking, access_desc};
use cuda::DriverHandle;
use cuda_abi::CUmemAccessDesc;
use protocol::record::{AllocationId, Phase};

/// One creation to rebuild.
pub(crate) struct LoadItem {
    handle: VHandle,
    pub(crate) id: AllocationId,
    /// Exported before: exported again into the cache once rebuilt.
    shared: bool,
    size: usize,
    device: i32,
    props: protocol::record::AllocationProps,
    /// The driver handle, if it survived (a Release that failed half way).
    real: Option<DriverHandle>,
    pub(crate) carrier: Option<u64>,
    unmapped: Vec<(u64, Mapping)>,
    cached: bool,
}

impl Tracking {
    /// Load and LoadFrom: recreates every released shared creation, fills the fresh ones with
    /// `fill` from where `source` says each one's bytes are (a carrier offset, an extent of a
    /// data file), then maps, exports and publishes them. `None` when everything was loaded
    /// already (phase Imported). On a failed fill the fresh allocations are released unless
    /// `keep` says a copy may still touch them.
    pub(crate) fn rebuild_creations<'s, T, S>(
        &'s self,
        request: &'static str,
        source: impl Fn(&LoadItem) -> Option<T>,
        fill: impl FnOnce(Vec<(TempMap<'s>, i32, T)>) -> Result<S, PhaseError>,
        keep: impl Fn() -> bool,
    ) -> Result<Option<(u64, S)>, PhaseError> {
        // Imported comes after a Load that completed: a resume that stopped after Import and is
        // run again finds everything loaded, and the phase stays Imported.
        if self.expect_phase(
            request,
            &[
                Phase::Frozen,
                Phase::Saved,
                Phase::Released,
                Phase::Loaded,
                Phase::Imported,
            ],
        )? == Phase::Imported
        {
            return Ok(None);
        }
        let mut items = self.load_items();
        // Fresh allocations for those released, filled from the carrier.
        let mut fresh: Vec<(usize, DriverHandle)> = Vec::new();
        let mut work = Vec::new();
        let undo_fresh = |fresh: &[(usize, DriverHandle)]| {
            self.release_unpublished(fresh.iter().map(|(_, real)| *real));
        };
        for (index, item) in items.iter().enumerate() {
            if item.real.is_some() {
                continue;
            }
            let Some(offset) = source(item) else {
                undo_fresh(&fresh);
                return Err(PhaseError::Internal(format!(
                    "allocation {} was released without its bytes saved where {request} loads \
                     from (carrier or data file)",
                    item.id
                )));
            };
            match self.fresh_allocation(item) {
                Ok((real, map)) => {
                    fresh.push((index, real));
                    work.push((map, item.device, offset));
                }
                Err(e) => {
                    self.unmap_after_copy(work, false);
                    undo_fresh(&fresh);
                    return Err(e);
                }
            }
        }
        let stats = match fill(work) {
            Ok(stats) => stats,
            Err(e) => {
                if !keep() {
                    undo_fresh(&fresh);
                }
                return Err(e);
            }
        };
        for (index, real) in &fresh {
            if let Some(item) = items.get_mut(*index) {
                item.real = Some(*real);
            }
        }
        let loaded = self.publish_all(&items, &fresh)?;
        self.set_phase(Phase::Loaded);
        Ok(Some((loaded, stats)))
    }

    /// The creations whose memory, mappings or export a Load must rebuild, in handle order, each
    /// with the device its bytes are copied on.
    fn load_items(&self) -> Vec<LoadItem> {
        let mut items = Vec::new();
        {
            let reg = self.lock();
            for (h, o) in reg.objects() {
                let Kind::Created { id, shared, .. } = o.kind else {
                    continue;
                };
                let unmapped: Vec<(u64, Mapping)> = reg
                    .mappings_of(h)
                    .into_iter()
                    .filter(|(_, m)| !m.mapped)
                    .collect();
                let cached = self.exports.contains(&id);
                if o.real.is_some() && unmapped.is_empty() && (cached || !shared) {
                    continue;
                }
                items.push(LoadItem {
                    handle: h,
                    id,
                    shared,
                    size: o.size as usize,
                    device: 0,
                    props: o.props,
                    real: o.real,
                    carrier: o.carrier,
                    unmapped,
                    cached,
                });
            }
        }
        items.sort_by_key(|i| i.handle);
        // Outside the state lock: the device of a placement may be asked of the driver.
        for item in &mut items {
            item.device = self.copy_device(&item.props);
        }
        items
    }

    /// A fresh allocation for a released `item`, mapped temporarily for the fill; released
    /// again when the temporary map fails.
    fn fresh_allocation(&self, item: &LoadItem) -> Result<(DriverHandle, TempMap<'_>), PhaseError> {
        let _context = copy::enter(&self.real, item.device)?;
        let prop = driver_props(&item.props);
        let real = check(
            || format!("allocation {}", item.id),
            self.real.mem_create(item.size, &prop, 0),
        )?;
        match self.temp_map(real, item.size, item.device) {
            Ok(map) => Ok((real, map)),
            Err(e) => {
                self.release_unpublished([real]);
                Err(e)
            }
        }
    }

    /// Maps, exports and publishes each item, one at a time: what is published stays published,
    /// and on a failure the fresh allocations not published yet are released. The bytes of the
    /// fresh ones.
    fn publish_all(
        &self,
        items: &[LoadItem],
        fresh: &[(usize, DriverHandle)],
    ) -> Result<u64, PhaseError> {
        let mut loaded = 0;
        for (index, item) in items.iter().enumerate() {
            let Some(real) = item.real else { continue };
            let published = copy::enter(&self.real, item.device)
                .map_err(PhaseError::from)
                .and_then(|_ctx| self.publish_creation(item, real));
            if let Err(e) = published {
                self.release_unpublished(
                    fresh
                        .iter()
                        .filter(|(i, _)| *i >= index)
                        .map(|(_, real)| *real),
                );
                return Err(e);
            }
            if fresh.iter().any(|(i, _)| *i == index) {
                loaded += item.size as u64;
            }
        }
        Ok(loaded)
    }

    /// Maps a rebuilt creation at its recorded addresses, exports it into the cache when it is
    /// shared and points the application's virtual handle at it.
    fn publish_creation(&self, item: &LoadItem, real: DriverHandle) -> Result<(), PhaseError> {
        let mapped = self.map_recorded(real, &item.unmapped)?;
        if item.shared && !item.cached {
            let exported = check(
                || format!("allocation {}", item.id),
                self.real.mem_export_fd(real, 0),
            );
            match exported {
                Ok(fd) => self.exports.insert(item.id, fd),
                Err(e) => {
                    self.unmap_addresses(&mapped, &item.unmapped);
                    return Err(e);
                }
            }
        }
        let mut reg = self.lock();
        reg.set_real(item.handle, Some(real));
        for address in mapped {
            reg.set_mapped(address, true);
        }
        Ok(())
    }

    /// Maps the unmapped recorded mappings of an object at their addresses with their access.
    /// Returns the addresses mapped (for undo).
    pub(crate) fn map_recorded(
        &self,
        real: DriverHandle,
        unmapped: &[(u64, Mapping)],
    ) -> Result<Vec<u64>, PhaseError> {
        let mut done = Vec::new();
        for (address, m) in unmapped {
            // The recorded address range lies in a reservation the application kept.
            let mapped = self
                .real
                .mem_map(*address, m.size as usize, m.offset as usize, real, 0);
            if let Err(e) = check(|| format!("recorded mapping at {address:#x}"), mapped) {
                self.unmap_addresses(&done, unmapped);
                return Err(e);
            }
            done.push(*address);
            if !m.access.is_empty() {
                let descs: Vec<CUmemAccessDesc> = m.access.iter().map(access_desc).collect();
                let granted = self.real.mem_set_access(*address, m.size as usize, &descs);
                if let Err(e) = check(|| format!("mapping at {address:#x}"), granted) {
                    self.unmap_addresses(&done, unmapped);
                    return Err(e);
                }
            }
        }
        Ok(done)
    }

    /// Undoes mappings this phase made (on its failure path, so a failed unmap is only logged:
    /// the phase's own error is what the tool gets).
    fn unmap_addresses(&self, addresses: &[u64], all: &[(u64, Mapping)]) {
        for (address, m) in all.iter().filter(|(a, _)| addresses.contains(a)) {
            if let Err(e) = self.real.mem_unmap(*address, m.size as usize) {
                log_warn!("mapping at {address:#x} not undone: {e}");
            }
        }
    }

    /// Releases driver handles this phase made and never published (failure paths: logged).
    pub(crate) fn release_unpublished(&self, handles: impl IntoIterator<Item = DriverHandle>) {
        for real in handles {
            if let Err(e) = self.real.mem_release(real) {
                log_warn!("an allocation this phase made was not released: {e}");
            }
        }
    }
}
