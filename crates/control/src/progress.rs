//! What a run reports as it goes and when it is done: progress of the long phases, their timings,
//! and the report of a suspend, resume, checkpoint or restore.

use crate::group::{PhaseResult, Snapshot};
use std::path::PathBuf;
use std::time::Instant;

/// Receives progress of long phases (the CLI draws bars on a terminal).
pub trait Progress: Sync {
    /// A phase starts; `total_bytes` is known for the phases that move bytes.
    fn phase_started(&self, _name: &'static str, _total_bytes: Option<u64>) {}
    /// Bytes moved by one participant.
    fn advance(&self, _bytes: u64) {}
    /// One participant finished a phase request (`step`): what its shim reported, with the copy
    /// statistics of Save and Load (the benchmark reads them here).
    fn participant_done(&self, _step: &'static str, _process: &str, _result: &PhaseResult) {}
    fn phase_finished(&self, _timing: &PhaseTiming) {}
}

/// Progress that goes nowhere.
#[derive(Debug, Default)]
pub struct Quiet;

impl Progress for Quiet {}

/// How long a phase took over the whole group, and what it moved.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PhaseTiming {
    pub name: &'static str,
    pub millis: f64,
    pub bytes: u64,
    /// Longest time a single shim spent in it (the group's phases run in parallel).
    pub slowest_shim_millis: f64,
}

impl PhaseTiming {
    /// Bytes per second over the phase's wall time, when it moved bytes.
    pub fn gigabytes_per_second(&self) -> Option<f64> {
        (self.bytes > 0 && self.millis > 0.0).then(|| self.bytes as f64 / self.millis / 1e6)
    }
}

/// One participant in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParticipantSummary {
    pub host_pid: u32,
    pub ns_pid: u32,
    pub command: String,
    /// Allocations it created (shared or private): what its carrier holds.
    pub created: usize,
    /// Of those, the ones it shares (exported).
    pub created_shared: usize,
    pub imported: usize,
    /// Bytes of its creations saved to the carrier.
    pub saved_bytes: u64,
}

/// What a suspend or resume did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub participants: Vec<ParticipantSummary>,
    pub phases: Vec<PhaseTiming>,
    /// Bytes of the allocations the shims created, shared or private, saved to (or loaded from)
    /// host carriers.
    pub saved_bytes: u64,
    pub state_file: PathBuf,
    pub total_millis: f64,
    /// Captured processes that had exited and were left out (`resume --allow-lost`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<String>,
    /// What could not be rebuilt because its creator is among `lost`: imports left unmapped.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_rebuilt: Vec<String>,
    /// When each process was drained, from the hold (a capture; empty for a rebuild).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drained: Vec<crate::drain::Drained>,
    /// The carrier the capture used, why, and what it holds (a capture; none for a rebuild).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<crate::carrier_policy::CarrierChoice>,
}

pub(crate) fn summarize(snapshots: &[Snapshot]) -> Vec<ParticipantSummary> {
    snapshots
        .iter()
        .map(|s| {
            let created = &s.record.allocations;
            ParticipantSummary {
                host_pid: s.info.host_pid,
                ns_pid: s.info.ns_pid,
                command: s.info.command.clone(),
                created: created.len(),
                created_shared: created.iter().filter(|a| a.shared).count(),
                imported: s.record.imports.len(),
                saved_bytes: created.iter().map(|a| a.size).sum(),
            }
        })
        .collect()
}

/// Records the phases of one run.
pub(crate) struct Clock<'a> {
    progress: &'a dyn Progress,
    pub(crate) phases: Vec<PhaseTiming>,
    /// When each process was drained, from the hold (a capture's first step).
    pub(crate) drained: Vec<crate::drain::Drained>,
}

impl<'a> Clock<'a> {
    /// Where the phases report the bytes they move, for the phases timed outside this module.
    pub(crate) fn progress(&self) -> &'a dyn Progress {
        self.progress
    }

    pub(crate) fn new(progress: &'a dyn Progress) -> Clock<'a> {
        Clock {
            progress,
            phases: Vec::new(),
            drained: Vec::new(),
        }
    }

    /// Times `step`, which returns the bytes it moved and the slowest shim's time, or the error
    /// of the step (a verb's own, where the step's failures differ in what they left).
    pub(crate) fn time<T, E>(
        &mut self,
        name: &'static str,
        total_bytes: Option<u64>,
        step: impl FnOnce() -> Result<(T, u64, f64), E>,
    ) -> Result<T, E> {
        self.progress.phase_started(name, total_bytes);
        let start = Instant::now();
        let (value, bytes, slowest_shim_millis) = step()?;
        let timing = PhaseTiming {
            name,
            millis: millis_since(start),
            bytes,
            slowest_shim_millis,
        };
        self.progress.phase_finished(&timing);
        self.phases.push(timing);
        Ok(value)
    }
}

pub(crate) fn millis_since(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}
