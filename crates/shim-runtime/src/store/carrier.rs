//! The in-process carrier store: this process's own host carrier (`Control::carrier`), filled
//! at Save and drained at Load by the copy engine in the mode `CUINTERPOSE_CARRIER` chose.
//! Each allocation's place is its offset in the carrier, kept in its record until Thaw.

use super::rebuild::LoadItem;
use super::{ByteStore, Mapped, SaveItem};
use crate::capture::{Capture, PhaseError};
use crate::log::log_debug;
use crate::track::Tracking;
use copy::{Direction, Unit};
use protocol::message::CopyStats;
use std::time::Duration;

/// This process's carrier. `native_follows` (Save only) says a native checkpoint comes after the
/// Save (not so for `suspend --keep-contexts`), which decides whether an `auto` carrier is pinned.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Carrier {
    pub(crate) native_follows: bool,
}

impl ByteStore for Carrier {
    type Place = u64;
    type Stats = copy::CopyStats;
    type Outcome = (u64, Option<CopyStats>);
    const SAVE: &'static str = "Save";
    const LOAD: &'static str = "Load";

    fn save(
        &self,
        t: &Tracking,
        c: &Capture,
        items: Vec<SaveItem>,
    ) -> Result<Self::Outcome, PhaseError> {
        let total: usize = items.iter().map(|i| i.size).sum();
        // The carrier is registered through the context of the first allocation's device.
        let pin_device = items.first().map_or(0, |i| i.device);
        let carrier = {
            let mut control = c.control();
            let pinned = control.carrier.pinned() > 0;
            if control.copy.carrier.pins(self.native_follows, pinned) {
                let (took, reused, _pinned) =
                    control
                        .carrier
                        .ensure_pinned(&t.real, total, copy::PIN_PIECE, pin_device)?;
                (took, reused)
            } else {
                control.carrier.ensure(total)?
            }
        };
        let mut offsets = Vec::with_capacity(items.len());
        let mut offset = 0u64;
        for item in &items {
            offsets.push(offset);
            offset += item.size as u64;
        }
        let work = t.map_for_copy(&items, &offsets)?;
        let copied = copy_through(t, c, &work, Direction::ToHost);
        t.unmap_after_copy(work, self.in_doubt(c));
        let stats = copied?;
        {
            let mut reg = t.lock();
            for (item, offset) in items.iter().zip(offsets) {
                if let Some(o) = reg.get_mut(item.handle) {
                    o.carrier = Some(offset);
                }
            }
        }
        let recorded = record(c, stats.report(carrier));
        Ok((stats.bytes, Some(recorded)))
    }

    fn place(&self, item: &LoadItem) -> Option<u64> {
        item.carrier
    }

    fn fill(
        &self,
        t: &Tracking,
        c: &Capture,
        work: &[Mapped<'_, u64>],
    ) -> Result<copy::CopyStats, PhaseError> {
        copy_through(t, c, work, Direction::ToDevice)
    }

    fn in_doubt(&self, c: &Capture) -> bool {
        c.control().carrier_poisoned()
    }

    fn loaded(&self, c: &Capture, rebuilt: Option<(u64, copy::CopyStats)>) -> Self::Outcome {
        match rebuilt {
            None => (0, None),
            Some((loaded, stats)) => (
                loaded,
                Some(record(c, stats.report((Duration::ZERO, false)))),
            ),
        }
    }
}

/// Makes this process's carrier as long as a Save of its allocations would need now and pins
/// it (`cuinterpose prepare --keep-contexts`, [`protocol::Request::PinCarrier`]), through the
/// context of the device the Save would pin it with; returns the bytes pinned. Runs on the control
/// worker outside any capture: the application goes on, and the carrier holds nothing it needs
/// (Thaw has loaded everything), so growing it loses nothing. Refused, nothing changed, where the
/// carrier policy never pins (`CUINTERPOSE_CARRIER=staged`); a registration the driver refuses
/// leaves the carrier staged, as at a Save, and says so.
pub(crate) fn pin_ahead(t: &Tracking, c: &Capture) -> Result<u64, PhaseError> {
    let items = t.save_items();
    let total: usize = items.iter().map(|i| i.size).sum();
    let mut control = c.control();
    let pinned = control.carrier.pinned() > 0;
    if !control.copy.carrier.pins(false, pinned) {
        return Err(PhaseError::NotPinned(
            "CUINTERPOSE_CARRIER=staged: this process's carrier is never pinned".into(),
        ));
    }
    if total == 0 {
        return Ok(0);
    }
    let device = items.first().map_or(0, |i| i.device);
    let (_, _, pinned) = control
        .carrier
        .ensure_pinned(&t.real, total, copy::PIN_PIECE, device)?;
    if !pinned {
        return Err(PhaseError::NotPinned(
            "the driver refused to register the carrier (RLIMIT_MEMLOCK or host memory): its \
             Saves copy staged"
                .into(),
        ));
    }
    Ok(control.carrier.pinned() as u64)
}

/// Copies between the carrier and allocations mapped temporarily. A copy that cannot be
/// confirmed finished poisons the carrier (fail-stop on this data: the mappings and the carrier
/// may still be read or written), which [`Carrier::in_doubt`] then reports.
fn copy_through(
    t: &Tracking,
    c: &Capture,
    work: &[Mapped<'_, u64>],
    dir: Direction,
) -> Result<copy::CopyStats, PhaseError> {
    let (base, config, pinned) = {
        let control = c.control();
        (
            control.carrier.base(),
            control.copy,
            control.carrier.pinned(),
        )
    };
    let mut units: Vec<Unit> = Vec::new();
    for (map, device, offset) in work {
        units.extend(copy::segments(
            *device,
            map.va(),
            base,
            *offset as usize,
            map.size(),
        ));
    }
    let needed = units.iter().map(|u| u.host + u.len).max().unwrap_or(base) - base;
    // Pinned only where the whole range is: a refused pinning (logged once by the carrier)
    // copies staged.
    let mode = config.carrier.mode(needed, pinned);
    let (stats, error) = copy::copy_all(&t.real, units, dir, mode, config.chunk);
    if stats.dma_uncertain {
        c.control().carrier.poison();
    }
    match error {
        Some(e) => Err(e.into()),
        None => Ok(stats),
    }
}

/// Keeps and logs a copying phase's figures (the carrier's and the helper's).
pub(crate) fn record(c: &Capture, last: CopyStats) -> CopyStats {
    log_debug!(
        "copied {} bytes {:?} with {} threads: carrier {} us (reused {}), pinning {} us, \
         copies {} us, {} staged fallbacks",
        last.bytes,
        last.mode,
        last.threads,
        last.carrier_micros,
        last.carrier_reused,
        last.pin_micros,
        last.copy_micros,
        last.staged_fallbacks
    );
    c.control().last = last;
    last
}
