//! A workload's group of CUDA processes as the tool sees it: discovery, a connection to every shim,
//! their records, and the whole-group checks that decide whether capture is safe. Everything here
//! is read-only: a refusal changes nothing in the workload.

use crate::discovery::{self, ProcessInfo, ProcessTree};
use crate::procfs::{Proc, Procs};
use crate::{ControlError, Refusal};
use protocol::message::DrainReport;
use protocol::{
    AllocationId, Backing, Blocker, HelloReply, Phase, ProcessRecord, Request, Response,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};
use transport::{Connection, TransportError};

/// The wire to one shim: the seam in front of its control socket. [`Connection`] is the real one;
/// the unit tests of the capture and rebuild put scripted shims behind it.
pub(crate) trait ShimLink: Send + Sync + std::fmt::Debug {
    /// Sends `request` (with a descriptor, for SaveTo and LoadFrom) and returns the answer.
    fn call_with(
        &mut self,
        request: &Request,
        file: Option<BorrowedFd<'_>>,
    ) -> Result<(Response, Option<OwnedFd>), TransportError>;
    fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), TransportError>;
}

impl ShimLink for Connection {
    fn call_with(
        &mut self,
        request: &Request,
        file: Option<BorrowedFd<'_>>,
    ) -> Result<(Response, Option<OwnedFd>), TransportError> {
        Connection::call_with(self, request, file)
    }

    fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), TransportError> {
        Connection::set_timeout(self, timeout)
    }
}

/// A connected participant: one CUDA process with the shim.
#[derive(Debug)]
pub struct Participant {
    pub info: ProcessInfo,
    pub hello: HelloReply,
    connection: Box<dyn ShimLink>,
    /// When the connection last carried a request, and the timeout set on it: a shim closes a
    /// tool connection idle for long (shim-runtime's server), so one idle for
    /// [`RECONNECT_AFTER`] is made again before the next request.
    last_used: Instant,
    timeout: Option<Duration>,
    /// How long a (re)connect may wait for the shim's greeting.
    connect_timeout: Duration,
    /// A capture runs: the connection holds the process's capture lease (the shim undoes a
    /// capture that released nothing when it ends), so it is never replaced.
    capturing: bool,
}

/// Idle time after which the tool connects again before a request: well below the shim's limit
/// for an idle tool connection (30 s), which keeps idle connections from holding its places.
pub const RECONNECT_AFTER: Duration = Duration::from_secs(10);

/// Why a process with the shim has no control socket the tool can use.
const NO_SOCKET: &str = "maps libcuinterpose.so but has no control socket of its user: its CUDA \
     calls are not tracked (CUDA not initialised yet, or its runtime did not start: its stderr \
     says why, e.g. a control directory it cannot use)";

impl Participant {
    /// Connects to the shim of `info` and says HELLO.
    pub fn connect(info: ProcessInfo, timeout: Duration) -> Result<Participant, ControlError> {
        let socket = info.control_socket.clone().ok_or_else(|| {
            ControlError::Refused(vec![Refusal {
                process: info.label(),
                reason: NO_SOCKET.into(),
            }])
        })?;
        let mut connection =
            Connection::connect(&socket, timeout).map_err(|source| ControlError::Participant {
                process: info.label(),
                source,
            })?;
        let request = Request::Hello {
            tool_version: crate::VERSION.to_string(),
        };
        let hello = match call(&mut connection, &info, &request)? {
            Response::Hello(hello) => hello,
            other => return Err(unexpected(&info, &request, other)),
        };
        Ok(Participant::over(
            info,
            hello,
            Box::new(connection),
            timeout,
        ))
    }

    /// A participant that greeted the tool over `link`.
    pub(crate) fn over(
        info: ProcessInfo,
        hello: HelloReply,
        link: Box<dyn ShimLink>,
        timeout: Duration,
    ) -> Participant {
        Participant {
            info,
            hello,
            connection: link,
            last_used: Instant::now(),
            timeout: Some(timeout),
            connect_timeout: timeout,
            capturing: false,
        }
    }

    /// Sends one request and returns the answer; a shim's Error is returned as [`ControlError::Shim`].
    pub fn request(&mut self, request: &Request) -> Result<Response, ControlError> {
        self.reconnect_if_idle()?;
        if !matches!(
            request,
            Request::Hello { .. } | Request::Inspect | Request::PinCarrier
        ) {
            self.capturing = true;
        }
        let answer = call(self.connection.as_mut(), &self.info, request);
        self.last_used = Instant::now();
        if matches!(request, Request::Thaw) && answer.is_ok() {
            // Out of the capture: the shim gave the lease back.
            self.capturing = false;
        }
        answer
    }

    /// Connects again after [`RECONNECT_AFTER`] of silence (the shim closes idle tool
    /// connections), unless this connection holds a capture.
    fn reconnect_if_idle(&mut self) -> Result<(), ControlError> {
        if !self.capturing && self.last_used.elapsed() >= RECONNECT_AFTER {
            let mut again = Participant::connect(self.info.clone(), self.connect_timeout)?;
            again.set_timeout(self.timeout)?;
            self.connection = again.connection;
        }
        Ok(())
    }

    /// Hold, Drain or Admit (drain.rs): how the process's drain stands.
    pub fn drain_request(&mut self, request: &Request) -> Result<DrainReport, ControlError> {
        match self.request(request)? {
            Response::Drain(report) => Ok(report),
            other => Err(unexpected(&self.info, request, other)),
        }
    }

    pub fn inspect(&mut self) -> Result<ProcessRecord, ControlError> {
        match self.request(&Request::Inspect)? {
            Response::Records(record) => Ok(record),
            other => Err(unexpected(&self.info, &Request::Inspect, other)),
        }
    }

    /// Has the shim pin its own carrier ahead of a keep-contexts suspend (`prepare
    /// --keep-contexts`); returns the bytes pinned and the shim-side time (µs). Not a capture: the
    /// shim gives its lease back at once. Waited for without the answer timeout: pinning many GiB
    /// takes as long as it takes (about 50 ms per GiB measured).
    pub fn pin_carrier(&mut self) -> Result<(u64, u64), ControlError> {
        let timeout = self.timeout;
        self.set_timeout(None)?;
        let answer = self.request(&Request::PinCarrier);
        self.set_timeout(timeout)?;
        match answer? {
            Response::Prepared { pinned, micros } => Ok((pinned, micros)),
            other => Err(unexpected(&self.info, &Request::PinCarrier, other)),
        }
    }

    /// Runs a phase request; returns the bytes it moved and the shim-side time.
    pub fn phase(&mut self, request: &Request) -> Result<PhaseResult, ControlError> {
        match self.request(request)? {
            Response::PhaseDone {
                phase,
                bytes,
                micros,
                stats,
            } => Ok(PhaseResult {
                phase,
                bytes,
                micros,
                stats,
            }),
            other => Err(unexpected(&self.info, request, other)),
        }
    }

    /// Runs a phase request that streams the data file `file` (SaveTo, LoadFrom).
    pub fn stream(
        &mut self,
        request: &Request,
        file: BorrowedFd<'_>,
    ) -> Result<Streamed, ControlError> {
        self.reconnect_if_idle()?;
        self.capturing = true;
        let answer = call_with(self.connection.as_mut(), &self.info, request, Some(file));
        self.last_used = Instant::now();
        match answer? {
            Response::Streamed {
                phase,
                bytes,
                micros,
                stats,
                file,
            } => Ok(Streamed {
                result: PhaseResult {
                    phase,
                    bytes,
                    micros,
                    stats: None,
                },
                stats,
                file,
            }),
            other => Err(unexpected(&self.info, request, other)),
        }
    }

    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ControlError> {
        self.timeout = timeout;
        self.connection
            .set_timeout(timeout)
            .map_err(|source| ControlError::Participant {
                process: self.info.label(),
                source,
            })
    }
}

/// What a shim reported for a finished phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseResult {
    pub phase: Phase,
    pub bytes: u64,
    pub micros: u64,
    /// How a copying phase (Save, Load) spent its time.
    pub stats: Option<protocol::message::CopyStats>,
}

/// What a shim answered to SaveTo or LoadFrom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    pub result: PhaseResult,
    pub stats: protocol::message::StreamStats,
    pub file: protocol::message::DataFile,
}

fn call(
    connection: &mut dyn ShimLink,
    info: &ProcessInfo,
    request: &Request,
) -> Result<Response, ControlError> {
    call_with(connection, info, request, None)
}

fn call_with(
    connection: &mut dyn ShimLink,
    info: &ProcessInfo,
    request: &Request,
    file: Option<BorrowedFd<'_>>,
) -> Result<Response, ControlError> {
    let (response, fd) =
        connection
            .call_with(request, file)
            .map_err(|source| ControlError::Participant {
                process: info.label(),
                source,
            })?;
    if fd.is_some() {
        return Err(ControlError::Protocol {
            process: info.label(),
            message: "the shim attached a descriptor to a coordinator answer".into(),
        });
    }
    match response {
        Response::Error { code, message } => Err(ControlError::Shim {
            process: info.label(),
            code,
            message,
        }),
        response => Ok(response),
    }
}

fn unexpected(info: &ProcessInfo, request: &Request, response: Response) -> ControlError {
    ControlError::Protocol {
        process: info.label(),
        message: format!("answered {request:?} with {response:?}"),
    }
}

/// The group under a root process, connected.
#[derive(Debug)]
pub struct Group {
    pub root: u32,
    pub participants: Vec<Participant>,
    /// Processes of the tree that do not use CUDA (listed for the report only).
    pub others: Vec<ProcessInfo>,
}

/// A participant's records, as read at one moment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    pub info: ProcessInfo,
    pub hello: HelloReplyView,
    pub record: ProcessRecord,
}

impl Snapshot {
    /// Bytes of the allocations the process created: what its Save moves.
    pub fn created_bytes(&self) -> u64 {
        self.record.allocations.iter().map(|a| a.size).sum()
    }
}

/// The parts of HELLO worth reporting.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HelloReplyView {
    pub shim_version: String,
    pub shim_sha256: String,
    pub driver_version: i32,
    /// Host memory its carrier holds pinned between cycles.
    pub carrier_pinned_bytes: u64,
    /// Its bytes of this cycle in the carrier helper, and the copy it holds of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier_helper: Option<protocol::message::HelperHold>,
}

impl From<&HelloReply> for HelloReplyView {
    fn from(h: &HelloReply) -> Self {
        HelloReplyView {
            shim_version: h.shim_version.clone(),
            shim_sha256: h.shim_sha256.clone(),
            driver_version: h.driver_version,
            carrier_pinned_bytes: h.carrier_pinned_bytes,
            carrier_helper: h.carrier_helper.clone(),
        }
    }
}

/// What discovery reads of the machine: the processes of a tree and what each one is (`/proc`,
/// [`ProcessTree`]), and the shims' control sockets. The seam in front of both, so that every
/// refusal of discovery is unit-tested with a scripted machine; [`Proc`] is the real one.
pub(crate) trait Processes: ProcessTree {
    /// Connects to the shim of `info` ([`Participant::connect`]).
    fn connect(&self, info: ProcessInfo, timeout: Duration) -> Result<Participant, ControlError>;
}

impl Processes for Proc {
    fn connect(&self, info: ProcessInfo, timeout: Duration) -> Result<Participant, ControlError> {
        Participant::connect(info, timeout)
    }
}

impl Group {
    /// Finds every CUDA process under `root` and connects to each shim. Fails closed, naming every
    /// CUDA process that lacks the shim or does not answer.
    pub fn discover(root: u32, timeout: Duration) -> Result<Group, ControlError> {
        Group::discover_in(&Proc, root, timeout)
    }

    /// [`Group::discover`] on `machine`.
    pub(crate) fn discover_in(
        machine: &dyn Processes,
        root: u32,
        timeout: Duration,
    ) -> Result<Group, ControlError> {
        let mut refusals = Vec::new();
        let mut participants = Vec::new();
        let mut others = Vec::new();
        for pid in machine.tree(root)? {
            let info = match machine.describe(pid) {
                Ok(info) => info,
                // Gone while we looked: not part of the group any more.
                Err(ControlError::Proc { .. }) if machine.stat(pid).is_none() => {
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !info.is_cuda() {
                others.push(info);
                continue;
            }
            if info.shim.is_none() {
                refusals.push(Refusal {
                    process: info.label(),
                    reason: format!(
                        "uses CUDA ({}) but does not have {} loaded; start it with `cuinterpose run`",
                        info.driver.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                        discovery::SHIM_LIBRARY
                    ),
                });
                continue;
            }
            // A stopped process cannot answer: named as what it is, without waiting for it.
            if let Some(reason) = stopped_reason(machine, pid) {
                refusals.push(Refusal {
                    process: info.label(),
                    reason,
                });
                continue;
            }
            match machine.connect(info.clone(), timeout) {
                Ok(p) => participants.push(p),
                Err(ControlError::Refused(mut r)) => refusals.append(&mut r),
                Err(e) => refusals.push(Refusal {
                    process: info.label(),
                    reason: stopped_reason(machine, pid)
                        .unwrap_or_else(|| no_answer_reason(e, timeout)),
                }),
            }
        }
        if !refusals.is_empty() {
            return Err(ControlError::Refused(refusals));
        }
        if participants.is_empty() {
            return Err(ControlError::NoCudaProcesses(root));
        }
        Ok(Group {
            root,
            participants,
            others,
        })
    }

    /// Reads every participant's records.
    pub fn snapshot(&mut self) -> Result<Vec<Snapshot>, ControlError> {
        self.participants
            .iter_mut()
            .map(|p| {
                Ok(Snapshot {
                    record: p.inspect()?,
                    hello: HelloReplyView::from(&p.hello),
                    info: p.info.clone(),
                })
            })
            .collect()
    }
}

/// Why a process stopped by a signal or a tracer (state `T` or `t`) cannot take part, or `None`
/// when it is not stopped.
fn stopped_reason(procs: &dyn Procs, pid: u32) -> Option<String> {
    let stat = procs.stat(pid)?;
    stat.stopped().then(|| {
        format!(
            "is stopped (state {}: SIGSTOP, a debugger, or a checkpoint whose dump was interrupted): \
             continue it (`kill -CONT {pid}`, or `cuinterpose resume` after an interrupted \
             checkpoint) and run this again",
            stat.state
        )
    })
}

/// Why a shim's HELLO failed, without repeating the process (the refusal names it).
fn no_answer_reason(error: ControlError, timeout: Duration) -> String {
    match error {
        ControlError::Participant {
            source: transport::TransportError::Timeout,
            ..
        } => format!("does not answer on its control socket (no reply within {timeout:?})"),
        ControlError::Participant {
            source: transport::TransportError::Protocol(e),
            ..
        } => format!(
            "answers in a way this tool does not understand ({e}); tool and shim must be the same version"
        ),
        ControlError::Participant { source, .. } => {
            format!("does not answer on its control socket: {source}")
        }
        ControlError::Protocol { message, .. } => format!("protocol error: {message}"),
        ControlError::Shim { code, message, .. } => {
            format!("refused HELLO ({code:?}): {message}")
        }
        other => other.to_string(),
    }
}

/// Whole-group checks on records read at one moment. `expected_phase` is the phase every
/// participant must be in (Running before capture, Frozen once frozen).
pub fn check_group(snapshots: &[Snapshot], expected_phase: Phase) -> Vec<Refusal> {
    check_group_except(snapshots, expected_phase, &HashSet::new())
}

/// [`check_group`] when some processes of the tree (by PID namespace and namespace PID) could
/// not be read and are refused for that already: an import from one of them is not a second,
/// misleading reason ("not part of this group").
fn check_group_except(
    snapshots: &[Snapshot],
    expected_phase: Phase,
    unread: &HashSet<(u64, u32)>,
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    // Creators by (PID namespace, namespace PID): namespace PIDs are only unique within one.
    let creators: HashMap<(u64, u32), &Snapshot> = snapshots
        .iter()
        .map(|s| ((s.info.pid_namespace, s.record.ns_pid), s))
        .collect();
    for s in snapshots {
        let refuse = |refusals: &mut Vec<Refusal>, reason: String| {
            refusals.push(Refusal {
                process: s.info.label(),
                reason,
            })
        };
        if s.record.phase != expected_phase {
            refuse(
                &mut refusals,
                format!(
                    "is in phase {:?}, expected {expected_phase:?}",
                    s.record.phase
                ),
            );
        }
        if s.record.calls_in_flight > 0 {
            refuse(
                &mut refusals,
                format!(
                    "has {} tracked CUDA call(s) in flight",
                    s.record.calls_in_flight
                ),
            );
        }
        for blocker in &s.record.blockers {
            refuse(&mut refusals, blocker_reason(blocker));
        }
        for import in &s.record.imports {
            match creators.get(&(s.info.pid_namespace, import.creator_ns_pid)) {
                None if unread.contains(&(s.info.pid_namespace, import.creator_ns_pid)) => {}
                None => refuse(
                    &mut refusals,
                    format!(
                        "imports allocation {} from ns pid {}, which is not part of this group",
                        import.id, import.creator_ns_pid
                    ),
                ),
                Some(creator) => {
                    if !creator
                        .record
                        .allocations
                        .iter()
                        .any(|a| a.id == import.id && a.shared)
                    {
                        refuse(
                            &mut refusals,
                            format!(
                                "imports allocation {} that its creator {} does not report as exported",
                                import.id,
                                creator.info.label()
                            ),
                        );
                    }
                }
            }
        }
    }
    refusals.extend(multicast_teams(snapshots, &creators, unread));
    refusals
}

/// Group-wide multicast checks: every multicast object's team is complete (the devices its
/// holders added, over the group, number the creator's `numDevices`), and an imported one names
/// a creator of the group that created and exported it. A capture must find every rank past its
/// `cuMulticastAddDevice` calls, or the rebuild would leave some rank waiting for a device that
/// nobody adds.
fn multicast_teams(
    snapshots: &[Snapshot],
    creators: &HashMap<(u64, u32), &Snapshot>,
    unread: &HashSet<(u64, u32)>,
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for s in snapshots {
        for m in &s.record.multicasts {
            let key = (s.info.pid_namespace, m.creator_ns_pid);
            if m.creator_ns_pid == s.record.ns_pid {
                let added: usize = snapshots
                    .iter()
                    .filter(|h| h.info.pid_namespace == s.info.pid_namespace)
                    .flat_map(|h| &h.record.multicasts)
                    .filter(|h| h.id == m.id && h.creator_ns_pid == m.creator_ns_pid)
                    .map(|h| h.devices.len())
                    .sum();
                if added < m.num_devices as usize {
                    refusals.push(Refusal {
                        process: s.info.label(),
                        reason: format!(
                            "holds multicast object {} whose team is incomplete: {added} of {} devices added over the group; add every device before a capture",
                            m.id, m.num_devices
                        ),
                    });
                }
                continue;
            }
            let reason = match creators.get(&key) {
                None if unread.contains(&key) => continue,
                None => format!(
                    "imports multicast object {} from ns pid {}, which is not part of this group",
                    m.id, m.creator_ns_pid
                ),
                Some(creator)
                    if !creator
                        .record
                        .multicasts
                        .iter()
                        .any(|c| c.id == m.id && c.shared) =>
                {
                    format!(
                        "imports multicast object {} that its creator {} does not report as exported",
                        m.id,
                        creator.info.label()
                    )
                }
                Some(_) => continue,
            };
            refusals.push(Refusal {
                process: s.info.label(),
                reason,
            });
        }
    }
    refusals
}

fn blocker_reason(blocker: &Blocker) -> String {
    let hint = match blocker {
        Blocker::ForeignImport { .. } => {
            "; start the exporting process under `cuinterpose run` too"
        }
        Blocker::UnsupportedExport { .. } | Blocker::UnsupportedImport { .. } => {
            "; only POSIX file descriptor sharing is supported"
        }
        Blocker::LegacyIpcExport { .. } | Blocker::LegacyIpcImport { .. } => {
            "; legacy CUDA IPC is not supported yet (PyTorch: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
        }
        Blocker::MulticastHandleType { .. } => {
            "; only POSIX file descriptor sharing of multicast objects is supported"
        }
        Blocker::MulticastForeignMemory { .. } => {
            "; bind memory made with cuMemCreate in a process under cuinterpose (or imported through it)"
        }
        Blocker::MulticastOutOfBounds { .. } => {
            "; a binding must lie inside its object and inside one allocation or mapping"
        }
        Blocker::UngatedSubmission { .. } => {
            "; this driver or runtime resolves an entry point the shim's driver table does not list: \
             report it (with `cuinterpose doctor` output) so it is added"
        }
    };
    // The driver tells an importer no size before it maps (the shim reports 0): say so rather
    // than print a 0-byte allocation.
    let what = match blocker {
        Blocker::ForeignImport { serial, size: 0 } => format!(
            "holds a foreign import #{serial} (size unknown until mapped) from a process without the shim"
        ),
        Blocker::UnsupportedImport {
            handle_type,
            size: 0,
        } => format!(
            "imported an allocation (size unknown until mapped) with unsupported handle type {handle_type:#x}"
        ),
        other => other.to_string(),
    };
    format!("{what}{hint}")
}

/// One shared allocation across the group: who created it, who imports it, where it is mapped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SharedAllocation {
    pub id: String,
    pub size: u64,
    pub device: i32,
    pub creator: String,
    pub importers: Vec<String>,
    /// `process: address+size` for every mapping of it in the group.
    pub mappings: Vec<String>,
}

/// The sharing topology of a group, for `cuinterpose inspect`.
pub fn topology(snapshots: &[Snapshot]) -> Vec<SharedAllocation> {
    let mut by_id: BTreeMap<AllocationId, SharedAllocation> = BTreeMap::new();
    for s in snapshots {
        for a in s.record.allocations.iter().filter(|a| a.shared) {
            by_id.insert(
                a.id,
                SharedAllocation {
                    id: a.id.to_string(),
                    size: a.size,
                    device: a.props.location_id,
                    creator: s.info.label(),
                    importers: Vec::new(),
                    mappings: Vec::new(),
                },
            );
        }
    }
    for s in snapshots {
        for import in &s.record.imports {
            let entry = by_id.entry(import.id).or_insert_with(|| SharedAllocation {
                id: import.id.to_string(),
                size: import.size,
                device: import.props.location_id,
                creator: format!("ns pid {} (not in group)", import.creator_ns_pid),
                importers: Vec::new(),
                mappings: Vec::new(),
            });
            entry.importers.push(s.info.label());
        }
        for m in &s.record.mappings {
            if let Backing::Created(id) | Backing::Imported(id) = m.backing
                && let Some(entry) = by_id.get_mut(&id)
            {
                entry.mappings.push(format!(
                    "pid {}: {:#x}+{:#x}",
                    s.info.host_pid, m.address, m.size
                ));
            }
        }
    }
    by_id.into_values().collect()
}

/// One multicast object across the group: its creator, its team and, per holder, what it added,
/// bound and mapped.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SharedMulticast {
    pub id: String,
    pub size: u64,
    pub num_devices: u32,
    /// Devices added over the group.
    pub devices_added: usize,
    pub creator: String,
    /// `pid N: devices [..], B binding(s), M mapping(s)` for every process holding it.
    pub holders: Vec<String>,
}

/// The multicast objects of a group, for `cuinterpose inspect`.
pub fn multicast_topology(snapshots: &[Snapshot]) -> Vec<SharedMulticast> {
    let mut by_id: BTreeMap<AllocationId, SharedMulticast> = BTreeMap::new();
    for s in snapshots {
        for m in &s.record.multicasts {
            let entry = by_id.entry(m.id).or_insert_with(|| SharedMulticast {
                id: m.id.to_string(),
                size: m.size,
                num_devices: 0,
                devices_added: 0,
                creator: format!("ns pid {} (not in group)", m.creator_ns_pid),
                holders: Vec::new(),
            });
            if m.creator_ns_pid == s.record.ns_pid {
                entry.creator = s.info.label();
                entry.num_devices = m.num_devices;
            }
            entry.devices_added += m.devices.len();
            let mappings = s
                .record
                .mappings
                .iter()
                .filter(|r| r.backing == Backing::Multicast(m.id))
                .count();
            entry.holders.push(format!(
                "pid {}: devices {:?}, {} binding(s), {mappings} mapping(s)",
                s.info.host_pid,
                m.devices,
                m.bindings.len()
            ));
        }
    }
    by_id.into_values().collect()
}

/// What `cuinterpose inspect` shows: every process of the tree, the topology of the ones that
/// answered, and whether capture would be refused (and why). Never changes anything.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InspectReport {
    pub root: u32,
    pub processes: Vec<ProcessStatus>,
    pub snapshots: Vec<Snapshot>,
    pub shared: Vec<SharedAllocation>,
    pub multicasts: Vec<SharedMulticast>,
    /// Empty when the group can be captured now.
    pub refusals: Vec<Refusal>,
    /// The suspension in progress, when a state file for this root is where `resume` looks for
    /// it: how the group was suspended (the shims know their phase, not the mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspended: Option<crate::statefile::Suspension>,
    /// The carrier helpers holding bytes of the group (`suspend --carrier helper`), and their
    /// health.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub carrier_helpers: Vec<crate::carrier_helper::HelperStatus>,
    /// Suspended: the carrier the suspension used and what it holds; running: the one a plain
    /// `suspend` would choose now, and why (`carrier_choice::for_inspect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<crate::carrier_policy::CarrierChoice>,
}

/// One process of the tree and what the tool could learn from it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProcessStatus {
    pub info: ProcessInfo,
    /// `cuda+shim`, `cuda, no shim`, `no cuda`, or why the shim did not answer.
    pub status: String,
}

pub fn inspect(
    root: u32,
    state_dir: Option<&std::path::Path>,
    timeout: Duration,
) -> Result<InspectReport, ControlError> {
    let mut processes = Vec::new();
    let mut snapshots = Vec::new();
    let mut refusals = Vec::new();
    let mut unread = HashSet::new();
    for pid in discovery::process_tree(root)? {
        let Ok(info) = discovery::describe(pid) else {
            continue;
        };
        if info.shim.is_some() {
            // Taken out again below once its records are read.
            unread.insert((info.pid_namespace, info.ns_pid));
        }
        let status = if !info.is_cuda() {
            "no cuda".to_string()
        } else if info.shim.is_none() {
            refusals.push(Refusal {
                process: info.label(),
                reason: format!(
                    "uses CUDA but does not have {} loaded",
                    discovery::SHIM_LIBRARY
                ),
            });
            "cuda, no shim".to_string()
        } else if info.control_socket.is_none() {
            refusals.push(Refusal {
                process: info.label(),
                reason: NO_SOCKET.into(),
            });
            "shim loaded, runtime off".to_string()
        } else {
            if let Some(reason) = stopped_reason(&Proc, pid) {
                refusals.push(Refusal {
                    process: info.label(),
                    reason,
                });
                processes.push(ProcessStatus {
                    info,
                    status: "stopped".to_string(),
                });
                continue;
            }
            match Participant::connect(info.clone(), timeout).and_then(|mut p| {
                Ok(Snapshot {
                    record: p.inspect()?,
                    hello: HelloReplyView::from(&p.hello),
                    info: info.clone(),
                })
            }) {
                Ok(snapshot) => {
                    unread.remove(&(info.pid_namespace, info.ns_pid));
                    snapshots.push(snapshot);
                    "cuda+shim".to_string()
                }
                Err(e) => {
                    refusals.push(Refusal {
                        process: info.label(),
                        reason: no_answer_reason(e, timeout),
                    });
                    "shim does not answer".to_string()
                }
            }
        };
        processes.push(ProcessStatus { info, status });
    }
    if !processes.iter().any(|p| p.info.is_cuda()) {
        refusals.push(Refusal {
            process: format!("pid {root}"),
            reason: "no CUDA process in this tree".into(),
        });
    }
    refusals.extend(check_group_except(&snapshots, Phase::Running, &unread));
    let shared = topology(&snapshots);
    let multicasts = multicast_topology(&snapshots);
    let suspended = crate::statefile::suspended_state(root, state_dir);
    let carrier_helpers = crate::carrier_helper::statuses(
        snapshots
            .iter()
            .map(|s| (&s.info, s.hello.carrier_helper.as_ref())),
    );
    Ok(InspectReport {
        root,
        processes,
        snapshots,
        shared,
        multicasts,
        refusals,
        suspended,
        carrier_helpers,
        carrier: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fakes::{self, Log, Machine, Shim, cuda_process};
    use protocol::{AllocationRecord, ImportRecord};

    fn snapshots(pids: &[u32]) -> Vec<Snapshot> {
        let log = Log::default();
        let mut group = fakes::group(pids.iter().map(|&pid| Shim::new(pid, &log)).collect());
        group.snapshot().unwrap()
    }

    fn reasons(refusals: &[Refusal]) -> Vec<String> {
        refusals.iter().map(ToString::to_string).collect()
    }

    use crate::fakes::PROPS;
    const ID: AllocationId = AllocationId([7; 16]);

    fn import_from(creator_ns_pid: u32) -> ImportRecord {
        ImportRecord {
            id: ID,
            creator_ns_pid,
            size: 1 << 20,
            props: PROPS,
            live_handles: 1,
        }
    }

    #[test]
    fn a_group_in_the_expected_phase_with_nothing_in_flight_passes() {
        assert!(check_group(&snapshots(&[100, 101]), Phase::Running).is_empty());
    }

    #[test]
    fn each_process_in_another_phase_or_with_calls_in_flight_or_a_blocker_is_named() {
        let mut group = snapshots(&[100, 101, 102]);
        group[0].record.phase = Phase::Saved;
        group[1].record.calls_in_flight = 2;
        group[2]
            .record
            .blockers
            .push(Blocker::LegacyIpcExport { address: 0x1000 });
        let refusals = check_group(&group, Phase::Running);
        let reasons = reasons(&refusals);
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert_eq!(
            reasons[0],
            "pid 100 (w): is in phase Saved, expected Running"
        );
        assert_eq!(
            reasons[1],
            "pid 101 (w): has 2 tracked CUDA call(s) in flight"
        );
        assert!(reasons[2].starts_with("pid 102 (w): "));
        assert!(
            reasons[2].ends_with("(PyTorch: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"),
            "{}",
            reasons[2]
        );
    }

    #[test]
    fn an_import_needs_its_creator_in_the_group_and_exporting_it() {
        let mut group = snapshots(&[100, 101]);
        // From a process outside the group.
        group[1].record.imports.push(import_from(9));
        assert_eq!(
            reasons(&check_group(&group, Phase::Running)),
            [
                "pid 101 (w): imports allocation 070707070707 from ns pid 9, which is not part of this group"
            ]
        );
        // From 100, which created it but never exported it.
        group[1].record.imports = vec![import_from(100)];
        group[0].record.allocations.push(AllocationRecord {
            id: ID,
            size: 1 << 20,
            props: PROPS,
            shared: false,
            live_handles: 1,
        });
        assert_eq!(
            reasons(&check_group(&group, Phase::Running)),
            [
                "pid 101 (w): imports allocation 070707070707 that its creator pid 100 (w) does not report as exported"
            ]
        );
        // Exported: the group may be captured.
        group[0].record.allocations[0].shared = true;
        assert!(check_group(&group, Phase::Running).is_empty());
    }

    #[test]
    fn an_import_from_a_process_that_could_not_be_read_is_not_refused_twice() {
        let mut group = snapshots(&[100]);
        group[0].record.imports.push(import_from(9));
        let unread = HashSet::from([(1, 9)]);
        assert!(check_group_except(&group, Phase::Running, &unread).is_empty());
    }

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn machine(processes: Vec<(ProcessInfo, Option<char>, bool)>) -> Machine {
        Machine {
            processes,
            ..Machine::default()
        }
    }

    fn without_cuda(pid: u32) -> ProcessInfo {
        ProcessInfo {
            driver: None,
            shim: None,
            ..cuda_process(pid)
        }
    }

    #[test]
    fn the_cuda_processes_are_connected_the_others_listed_and_the_gone_skipped() {
        let machine = machine(vec![
            (without_cuda(100), Some('S'), false),
            (cuda_process(101), Some('S'), true),
            // Gone while discovery looked.
            (cuda_process(102), None, true),
            (cuda_process(103), Some('R'), true),
        ]);
        let group = Group::discover_in(&machine, 100, TIMEOUT).unwrap();
        let pids: Vec<u32> = group.participants.iter().map(|p| p.info.host_pid).collect();
        assert_eq!(pids, [101, 103]);
        assert_eq!(group.others.len(), 1);
        assert_eq!(machine.log.entries(), ["101 Hello", "103 Hello"]);
    }

    #[test]
    fn every_process_that_cannot_take_part_is_refused_at_once_and_the_rest_still_asked() {
        let no_shim = ProcessInfo {
            shim: None,
            ..cuda_process(101)
        };
        let machine = machine(vec![
            (without_cuda(100), Some('S'), false),
            (no_shim, Some('S'), false),
            (cuda_process(102), Some('T'), true),
            (cuda_process(103), Some('S'), false),
            (cuda_process(104), Some('S'), true),
        ]);
        let error = Group::discover_in(&machine, 100, TIMEOUT).unwrap_err();
        let ControlError::Refused(refusals) = &error else {
            panic!("{error}");
        };
        let processes: Vec<&str> = refusals.iter().map(|r| r.process.as_str()).collect();
        assert_eq!(processes, ["pid 101 (w)", "pid 102 (w)", "pid 103 (w)"]);
        assert_eq!(
            refusals[0].reason,
            "uses CUDA (libcuda.so.1) but does not have libcuinterpose.so loaded; start it with \
             `cuinterpose run`"
        );
        assert!(refusals[1].reason.starts_with("is stopped (state T: "));
        assert_eq!(
            refusals[2].reason,
            "does not answer on its control socket (no reply within 2s)"
        );
        // A stopped process is not waited for; the others are all asked.
        assert_eq!(machine.log.entries(), ["103 Hello", "104 Hello"]);
    }

    #[test]
    fn a_tree_without_a_cuda_process_is_no_group() {
        let machine = machine(vec![(without_cuda(100), Some('S'), false)]);
        let error = Group::discover_in(&machine, 100, TIMEOUT).unwrap_err();
        assert!(
            matches!(error, ControlError::NoCudaProcesses(100)),
            "{error}"
        );
    }
}
