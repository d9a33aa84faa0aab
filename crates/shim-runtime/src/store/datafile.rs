//! The data-file store: a data file, or a block store directory, that the tool opened in the
//! checkpoint directory and passed with SaveTo or LoadFrom; [`crate::datafile`] streams the bytes.
//! Each allocation's place is its extent of the file ([`layout`]).
//!
//! State ([`crate::capture::Control::streamed`]): the record of the file this capture's SaveTo
//! wrote, until Thaw; LoadFrom reads only that file.

use super::rebuild::LoadItem;
use super::{ByteStore, Mapped, SaveItem};
use crate::capture::{Capture, PhaseError};
use crate::datafile::{DataFileError, Region, layout, read, read_blocks, write, write_blocks};
use crate::track::Tracking;
use protocol::message::{DataFile as Record, Extent, StreamStats};
use protocol::record::AllocationId;
use std::os::fd::BorrowedFd;

/// The data file `file`, or with `blocks` the block store whose directory `file` is, streamed by
/// `workers` threads.
#[derive(Debug)]
pub(crate) struct DataFile<'f> {
    file: BorrowedFd<'f>,
    blocks: bool,
    /// I/O threads ([`protocol::message::data_workers`], sent by the tool with the request).
    workers: usize,
    /// At LoadFrom, the checkpoint's copy of SaveTo's answer, which must be the one this process
    /// kept; empty at SaveTo, which makes it.
    record: Record,
}

impl<'f> DataFile<'f> {
    /// The store SaveTo writes: the data file `file`, or with `blocks` the block store whose
    /// directory `file` is, by `workers` threads.
    pub(crate) fn save_to(file: BorrowedFd<'f>, blocks: bool, workers: u16) -> DataFile<'f> {
        DataFile {
            file,
            blocks,
            workers: workers.into(),
            record: Record::default(),
        }
    }

    /// The store LoadFrom reads: the file `file` that `record` describes, by `workers` threads.
    pub(crate) fn load_from(file: BorrowedFd<'f>, record: Record, workers: u16) -> DataFile<'f> {
        DataFile {
            file,
            blocks: record.blocks.is_some(),
            workers: workers.into(),
            record,
        }
    }
}

impl ByteStore for DataFile<'_> {
    type Place = Extent;
    type Stats = StreamStats;
    type Outcome = (u64, StreamStats, Record);
    const SAVE: &'static str = "SaveTo";
    const LOAD: &'static str = "LoadFrom";

    fn save(
        &self,
        t: &Tracking,
        c: &Capture,
        items: Vec<SaveItem>,
    ) -> Result<Self::Outcome, PhaseError> {
        let sizes: Vec<(AllocationId, u64)> = items.iter().map(|i| (i.id, i.size as u64)).collect();
        let (extents, length) = layout(&sizes);
        let work = t.map_for_copy(&items, &extents)?;
        let regions = regions_of(&work);
        // Synchronous copies only: when `write` returns no copy can touch the mappings.
        let written = if self.blocks {
            write_blocks(&t.real, self.file, &regions, length, self.workers)
        } else {
            write(&t.real, self.file, &regions, length, self.workers)
        };
        t.unmap_after_copy(work, false);
        let (record, stats) = written?;
        let bytes = record.extents.iter().map(|e| e.size).sum();
        c.control().streamed = Some(record.clone());
        Ok((bytes, stats, record))
    }

    fn check_load(&self, c: &Capture) -> Result<(), PhaseError> {
        let ours = c.control().streamed.clone();
        let why = match ours {
            Some(ours) if ours == self.record => return Ok(()),
            Some(_) => "it differs from the one this process wrote in this capture",
            None => "this process wrote no data file in this capture",
        };
        Err(DataFileError::Mismatch(why.into()).into())
    }

    fn place(&self, item: &LoadItem) -> Option<Extent> {
        self.record
            .extents
            .iter()
            .find(|e| e.id == item.id)
            .copied()
    }

    fn fill(
        &self,
        t: &Tracking,
        _c: &Capture,
        work: &[Mapped<'_, Extent>],
    ) -> Result<StreamStats, PhaseError> {
        let regions = regions_of(work);
        let read = if self.blocks {
            read_blocks(&t.real, self.file, &regions, &self.record, self.workers)
        } else {
            read(&t.real, self.file, &regions, &self.record, self.workers)
        };
        read.map_err(PhaseError::from)
    }

    /// Synchronous copies and a synchronised context: nothing touches the mappings after a fill.
    fn in_doubt(&self, _c: &Capture) -> bool {
        false
    }

    fn loaded(&self, _c: &Capture, rebuilt: Option<(u64, StreamStats)>) -> Self::Outcome {
        let (bytes, stats) = rebuilt.unwrap_or_default();
        (bytes, stats, self.record.clone())
    }
}

fn regions_of(work: &[Mapped<'_, Extent>]) -> Vec<Region> {
    work.iter()
        .map(|(map, device, extent)| Region {
            device: *device,
            va: map.va(),
            extent: *extent,
        })
        .collect()
}
