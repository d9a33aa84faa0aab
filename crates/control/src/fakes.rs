//! Scripted stand-ins behind the seams of the capture and rebuild, for their unit tests: shims
//! behind [`ShimLink`], a driver behind [`NativeCheckpoint`], `/proc` behind [`Procs`] and
//! [`crate::discovery::ProcessTree`]. Each
//! writes what it was asked into one shared [`Log`], so a test asserts which calls were made, in
//! which order, and what state each fake is left in.

use crate::ControlError;
use crate::discovery::ProcessInfo;
use crate::group::{Group, Participant, ShimLink};
use crate::native::{NativeCheckpoint, ProcessState};
use crate::procfs::{Procs, RootDir, Stat, Thread};
use cuda_abi::{CUresult, CUuuid};
use protocol::message::DrainReport;
use protocol::{ErrorCode, GateRecord, HelloReply, Phase, ProcessRecord, Request, Response};
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use transport::TransportError;

/// The properties of a plain device allocation shared through a POSIX descriptor (the
/// records the tests make).
pub(crate) const PROPS: protocol::AllocationProps = protocol::AllocationProps {
    allocation_type: 1,
    requested_handle_types: 1,
    location_type: 1,
    location_id: 0,
    compression_type: 0,
    gpu_direct_rdma_capable: 0,
    usage: 0,
};

/// Every call the fakes were made, in the order they were made: `"101 Freeze"` for a shim's
/// request, `"native lock 101"` for the driver's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn push(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }

    pub(crate) fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The requests shim `pid` got, in order (a shim's requests are sequential; different
    /// shims' run in parallel).
    pub(crate) fn shim(&self, pid: u32) -> Vec<String> {
        let prefix = format!("{pid} ");
        self.entries()
            .iter()
            .filter_map(|e| e.strip_prefix(&prefix).map(str::to_string))
            .collect()
    }

    /// The driver's calls, sorted (they run in parallel within a step).
    pub(crate) fn native(&self) -> Vec<String> {
        let mut calls: Vec<String> = self
            .entries()
            .into_iter()
            .filter_map(|e| e.strip_prefix("native ").map(str::to_string))
            .collect();
        calls.sort();
        calls
    }
}

/// The name of a request's variant (`Freeze`, `SaveTo`, `Multicast`).
pub(crate) fn request_name(request: &Request) -> String {
    let text = format!("{request:?}");
    text.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A shim that answers as a real one does, moving through the phases, except where told to
/// refuse a request.
#[derive(Debug)]
pub(crate) struct Shim {
    pid: u32,
    phase: Phase,
    log: Log,
    /// Requests (by name) it answers with an Error, and the error's code.
    refuses: Vec<(&'static str, ErrorCode)>,
    /// Whether a Drain finds it at rest (a job that never stops is not).
    drains: bool,
    /// Tracked calls its records show in flight once it is frozen (a shim that froze badly).
    in_flight_when_frozen: u32,
}

impl Shim {
    pub(crate) fn new(pid: u32, log: &Log) -> Shim {
        Shim {
            pid,
            phase: Phase::Running,
            log: log.clone(),
            refuses: Vec::new(),
            drains: true,
            in_flight_when_frozen: 0,
        }
    }

    /// Answers `request` (by name) with an Error of `code`.
    pub(crate) fn refusing(mut self, request: &'static str, code: ErrorCode) -> Shim {
        self.refuses.push((request, code));
        self
    }

    /// Never drained.
    pub(crate) fn busy(mut self) -> Shim {
        self.drains = false;
        self
    }

    /// Its records show a tracked call in flight once it is frozen.
    pub(crate) fn in_flight_when_frozen(mut self) -> Shim {
        self.in_flight_when_frozen = 1;
        self
    }

    fn record(&self) -> ProcessRecord {
        ProcessRecord {
            ns_pid: self.pid,
            phase: self.phase,
            allocations: Vec::new(),
            imports: Vec::new(),
            mappings: Vec::new(),
            reservations: Vec::new(),
            blockers: Vec::new(),
            calls_in_flight: match self.phase {
                Phase::Frozen => self.in_flight_when_frozen,
                _ => 0,
            },
            multicasts: Vec::new(),
            unowned: Vec::new(),
            gate: GateRecord::default(),
        }
    }

    fn answer(&mut self, request: &Request) -> Response {
        let name = request_name(request);
        if let Some((_, code)) = self.refuses.iter().find(|(r, _)| *r == name) {
            return Response::Error {
                code: *code,
                message: format!("{name} refused"),
            };
        }
        let phase = match request {
            Request::Inspect => return Response::Records(self.record()),
            Request::Hold | Request::Drain { .. } | Request::Admit { .. } => {
                let drained = self.drains && !matches!(request, Request::Hold);
                return Response::Drain(DrainReport {
                    drained,
                    waiting: 0,
                    admitted: 0,
                    granted: 0,
                    busy: if drained {
                        Vec::new()
                    } else {
                        vec!["device 0: a kernel that never ends".into()]
                    },
                    held_micros: 0,
                });
            }
            Request::Freeze { .. } => Phase::Frozen,
            Request::Save | Request::SaveKeepingContexts | Request::SaveThroughHelper { .. } => {
                Phase::Saved
            }
            Request::Release => Phase::Released,
            Request::Load => Phase::Loaded,
            Request::Import => Phase::Imported,
            Request::Thaw => Phase::Running,
            _ => self.phase,
        };
        self.phase = phase;
        Response::PhaseDone {
            phase,
            bytes: 0,
            micros: 0,
            stats: None,
        }
    }
}

impl ShimLink for Shim {
    fn call_with(
        &mut self,
        request: &Request,
        _file: Option<BorrowedFd<'_>>,
    ) -> Result<(Response, Option<OwnedFd>), TransportError> {
        self.log
            .push(format!("{} {}", self.pid, request_name(request)));
        Ok((self.answer(request), None))
    }

    fn set_timeout(&self, _timeout: Option<Duration>) -> Result<(), TransportError> {
        Ok(())
    }
}

/// A CUDA process with the shim, as discovery describes it.
pub(crate) fn cuda_process(pid: u32) -> ProcessInfo {
    ProcessInfo {
        host_pid: pid,
        ns_pid: pid,
        pid_namespace: TOOL_PID_NAMESPACE,
        command: "w".into(),
        driver: Some("libcuda.so.1".into()),
        shim: Some("libcuinterpose.so".into()),
        control_socket: None,
    }
}

/// A participant connected to `shim`, as `info`.
fn participant(info: ProcessInfo, shim: Shim) -> Participant {
    let hello = HelloReply {
        shim_version: crate::VERSION.into(),
        ns_pid: info.ns_pid,
        shim_sha256: "0".repeat(64),
        driver_version: 13000,
        carrier_pinned_bytes: 0,
        carrier_helper: None,
    };
    Participant::over(info, hello, Box::new(shim), Duration::from_secs(5))
}

/// A group of scripted shims under root `shims[0]`'s pid.
pub(crate) fn group(shims: Vec<Shim>) -> Group {
    let participants: Vec<Participant> = shims
        .into_iter()
        .map(|shim| participant(cuda_process(shim.pid), shim))
        .collect();
    Group {
        root: participants[0].info.host_pid,
        participants,
        others: Vec::new(),
    }
}

/// A driver whose checkpoint calls succeed except where told, in processes in the native state
/// it keeps for each.
#[derive(Debug)]
pub(crate) struct Native {
    log: Log,
    /// `(call, pid)` that fail.
    fails: Vec<(&'static str, u32)>,
    states: Mutex<HashMap<u32, ProcessState>>,
}

impl Native {
    pub(crate) fn new(log: &Log) -> Native {
        Native {
            log: log.clone(),
            fails: Vec::new(),
            states: Mutex::new(HashMap::new()),
        }
    }

    /// `call` (`lock`, `checkpoint`, `restore`, `unlock`, `state`) fails for `pid`.
    pub(crate) fn failing(mut self, call: &'static str, pid: u32) -> Native {
        self.fails.push((call, pid));
        self
    }

    /// `pid` starts in native state `state`.
    pub(crate) fn with_state(self, pid: u32, state: ProcessState) -> Native {
        self.states.lock().unwrap().insert(pid, state);
        self
    }

    /// The native state `pid` is left in.
    pub(crate) fn state_of(&self, pid: u32) -> ProcessState {
        *self
            .states
            .lock()
            .unwrap()
            .get(&pid)
            .unwrap_or(&ProcessState::Running)
    }

    /// Logs the call; fails it as told, or moves `pid` from `from` to `to`.
    fn step(
        &self,
        call: &'static str,
        pid: u32,
        from: ProcessState,
        to: ProcessState,
    ) -> Result<(), ControlError> {
        self.log.push(format!("native {call} {pid}"));
        let mut states = self.states.lock().unwrap();
        let now = states.entry(pid).or_insert(ProcessState::Running);
        if self.fails.contains(&(call, pid)) || *now != from {
            return Err(ControlError::Driver {
                call,
                result: CUresult::ERROR_INVALID_VALUE,
            });
        }
        *now = to;
        Ok(())
    }
}

impl NativeCheckpoint for Native {
    fn lock(&self, pid: u32, _timeout_ms: u32) -> Result<(), ControlError> {
        self.step("lock", pid, ProcessState::Running, ProcessState::Locked)
    }

    fn checkpoint(&self, pid: u32) -> Result<(), ControlError> {
        self.step(
            "checkpoint",
            pid,
            ProcessState::Locked,
            ProcessState::Checkpointed,
        )
    }

    fn restore(&self, pid: u32, _pairs: &[(CUuuid, CUuuid)]) -> Result<(), ControlError> {
        self.step(
            "restore",
            pid,
            ProcessState::Checkpointed,
            ProcessState::Locked,
        )
    }

    fn restore_thread(&self, pid: u32) -> Result<u32, ControlError> {
        Ok(pid)
    }

    fn unlock(&self, pid: u32) -> Result<(), ControlError> {
        self.step("unlock", pid, ProcessState::Locked, ProcessState::Running)
    }

    fn state(&self, pid: u32) -> Result<ProcessState, ControlError> {
        let state = self.state_of(pid);
        self.step("state", pid, state, state)?;
        Ok(state)
    }
}

/// The PID namespace of the tool, and of every process [`cuda_process`] describes.
pub(crate) const TOOL_PID_NAMESPACE: u64 = 1;

/// The tool's root directory, and that of every process not given another.
pub(crate) const TOOL_ROOT: RootDir = RootDir { dev: 1, ino: 2 };

/// `pid` is not in `/proc`.
fn no_such(pid: u32, rest: &str) -> ControlError {
    ControlError::Proc {
        pid,
        path: crate::procfs::path(pid, rest),
        source: std::io::ErrorKind::NotFound.into(),
    }
}

/// A process of state `state` (`/proc/<pid>/stat`'s letter).
fn stat_of(state: char) -> Stat {
    Stat {
        state,
        ppid: 1,
        tty_nr: 0,
        num_threads: 1,
        start_time: 1,
    }
}

/// A process tree as discovery sees it: each process, its state letter in `/proc/<pid>/stat`
/// (`None`: gone), and whether its shim answers; the tree is the processes in their order, the
/// first its root.
#[derive(Debug, Default)]
pub(crate) struct Machine {
    pub(crate) processes: Vec<(ProcessInfo, Option<char>, bool)>,
    /// Processes whose root directory is not the tool's ([`TOOL_ROOT`]).
    pub(crate) roots: Vec<(u32, RootDir)>,
    /// Processes' threads; a process not listed has one, its main thread.
    pub(crate) threads: Vec<(u32, Vec<Thread>)>,
    pub(crate) log: Log,
}

impl Machine {
    /// Process `pid` while it is there (not gone).
    fn live(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes
            .iter()
            .find(|(p, state, _)| p.host_pid == pid && state.is_some())
            .map(|(p, _, _)| p)
    }
}

impl Procs for Machine {
    fn stat(&self, pid: u32) -> Option<Stat> {
        let (_, state, _) = self.processes.iter().find(|(p, _, _)| p.host_pid == pid)?;
        state.map(stat_of)
    }

    fn pid_namespace(&self, pid: Option<u32>) -> Option<u64> {
        match pid {
            None => Some(TOOL_PID_NAMESPACE),
            Some(pid) => self.live(pid).map(|p| p.pid_namespace),
        }
    }

    fn root_dir(&self, pid: Option<u32>) -> Result<RootDir, ControlError> {
        let Some(pid) = pid else {
            return Ok(TOOL_ROOT);
        };
        self.live(pid).ok_or_else(|| no_such(pid, "root"))?;
        Ok(self
            .roots
            .iter()
            .find(|(p, _)| *p == pid)
            .map_or(TOOL_ROOT, |(_, root)| *root))
    }

    fn threads(&self, pid: u32) -> Vec<Thread> {
        let Some(info) = self.live(pid) else {
            return Vec::new();
        };
        match self.threads.iter().find(|(p, _)| *p == pid) {
            Some((_, threads)) => threads.clone(),
            None => vec![Thread {
                host: pid,
                own: Some(info.ns_pid),
            }],
        }
    }
}

impl crate::discovery::ProcessTree for Machine {
    /// Every process, under a root that is there (as /proc's tree of a root that exited fails).
    fn tree(&self, root: u32) -> Result<Vec<u32>, ControlError> {
        self.live(root).ok_or_else(|| no_such(root, "task"))?;
        Ok(self.processes.iter().map(|(p, _, _)| p.host_pid).collect())
    }

    fn describe(&self, pid: u32) -> Result<ProcessInfo, ControlError> {
        self.live(pid).cloned().ok_or_else(|| no_such(pid, "maps"))
    }
}

impl crate::group::Processes for Machine {
    fn connect(&self, info: ProcessInfo, _timeout: Duration) -> Result<Participant, ControlError> {
        self.log.push(format!("{} Hello", info.host_pid));
        let answers = self
            .processes
            .iter()
            .any(|(p, _, answers)| p.host_pid == info.host_pid && *answers);
        if answers {
            let shim = Shim::new(info.host_pid, &self.log);
            Ok(participant(info, shim))
        } else {
            Err(ControlError::Participant {
                process: info.label(),
                source: TransportError::Timeout,
            })
        }
    }
}

/// `/proc` in which the processes listed have exited and every other one sleeps, with one
/// thread, in the tool's PID namespace and root.
#[derive(Debug, Default)]
pub(crate) struct Exited(pub(crate) Vec<u32>);

impl Exited {
    fn alive(&self, pid: u32) -> bool {
        !self.0.contains(&pid)
    }
}

impl Procs for Exited {
    fn stat(&self, pid: u32) -> Option<Stat> {
        self.alive(pid).then_some(stat_of('S'))
    }

    fn pid_namespace(&self, pid: Option<u32>) -> Option<u64> {
        pid.is_none_or(|pid| self.alive(pid))
            .then_some(TOOL_PID_NAMESPACE)
    }

    fn root_dir(&self, pid: Option<u32>) -> Result<RootDir, ControlError> {
        match pid {
            Some(pid) if !self.alive(pid) => Err(no_such(pid, "root")),
            _ => Ok(TOOL_ROOT),
        }
    }

    fn threads(&self, pid: u32) -> Vec<Thread> {
        if self.alive(pid) {
            vec![Thread {
                host: pid,
                own: Some(pid),
            }]
        } else {
            Vec::new()
        }
    }
}
