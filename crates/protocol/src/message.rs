//! Control-socket messages and their framing.
//!
//! A frame is a 12-byte header, `magic "CUIP" | version u16 LE | kind u16 LE | length u32 LE`, then
//! `length` bytes of body (postcard). At most one descriptor rides on a frame (SCM_RIGHTS on its first
//! byte), and only a [`Response::Fd`], a [`Response::CarrierFd`], a [`Request::SaveTo`], a
//! [`Request::LoadFrom`] and a [`Request::CarrierItem`] carry one. The kind in the header repeats the message's
//! variant so that a reader can refuse a frame before decoding its body (the peer fd service accepts
//! only [`Request::GetFd`]), and so that a version mismatch is reported as such instead of as garbage.
//!
//! The kinds are explicit numbers ([`Request::kind`], [`Response::kind`]); inside a body, postcard
//! writes fields and enum variants by their order of declaration, so that order is the format
//! (append only, with a [`PROTOCOL_VERSION`] bump), pinned by `tests/wire_format.rs`.

use crate::ProtocolError;
use crate::record::{AllocationId, Phase, ProcessRecord};
use serde::{Deserialize, Serialize};

pub const MAGIC: [u8; 4] = *b"CUIP";
/// Bumped on any change of the encoding of a message or record (a field or variant added, removed,
/// reordered or retyped); both ends must agree exactly. The compatibility rule is in
/// `docs/design.md` ("Versions"); `tests/wire_format.rs` pins the bytes this version writes.
pub const PROTOCOL_VERSION: u16 = 12;
pub const HEADER_LEN: usize = 12;
/// Largest body either side accepts. A record of a process with tens of thousands of mappings fits.
pub const MAX_BODY_LEN: u32 = 16 << 20;

/// The fixed frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u16,
    pub kind: u16,
    pub length: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&self.kind.to_le_bytes());
        out[8..12].copy_from_slice(&self.length.to_le_bytes());
        out
    }

    /// Checks magic, version and length bound; the kind is checked by the body decoder.
    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, ProtocolError> {
        let [m0, m1, m2, m3, v0, v1, k0, k1, l0, l1, l2, l3] = *bytes;
        if [m0, m1, m2, m3] != MAGIC {
            return Err(ProtocolError::BadMagic);
        }
        let header = FrameHeader {
            version: u16::from_le_bytes([v0, v1]),
            kind: u16::from_le_bytes([k0, k1]),
            length: u32::from_le_bytes([l0, l1, l2, l3]),
        };
        if header.version != PROTOCOL_VERSION {
            return Err(ProtocolError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: header.version,
            });
        }
        if header.length > MAX_BODY_LEN {
            return Err(ProtocolError::TooLarge {
                length: header.length as u64,
                limit: MAX_BODY_LEN as u64,
            });
        }
        Ok(header)
    }
}

/// What the tool (or a peer shim) asks a shim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First message of every coordinator connection.
    Hello { tool_version: String },
    /// Read-only: the process's records.
    Inspect,
    /// Peer fd service: the real descriptor of an allocation this process created and exported.
    GetFd { id: AllocationId },
    /// Hold tracked memory calls, wait for those in flight, synchronise contexts.
    Freeze { timeout_ms: u32 },
    /// Creators copy the bytes of shared allocations into host carriers.
    Save,
    /// Importers release imports; creators drain their export cache and release shared allocations.
    Release,
    /// Creators recreate shared allocations at their addresses, refill them and export them again.
    Load,
    /// Importers import again through their tickets and map at the original addresses.
    Import,
    /// Let held calls go; back to running.
    Thaw,
    /// One group-wide step of the multicast rebuild, after Import, with a barrier after each
    /// (the tool sends the next step only once every participant has done this one).
    Multicast(MulticastStep),
    /// Save into a data file instead of the host carrier (checkpoint to disk): creators stream
    /// the bytes Save would copy into the file on this frame's descriptor, which the tool opened
    /// for writing and left empty; or, with `store`, into the block store whose directory is the
    /// descriptor (one file per distinct 2 MiB block, named by its BLAKE3: [`block_path`]).
    /// Answered with [`Response::Streamed`]. `workers` I/O threads stream it
    /// ([`data_workers`]).
    SaveTo { store: bool, workers: u16 },
    /// Load from the data file on this frame's descriptor instead of the carrier: `file` is what
    /// SaveTo answered (the manifest's record), and the bytes read must hash to its digest. When
    /// the record lists blocks ([`DataFile::blocks`]) the descriptor is the block store's
    /// directory, and each block read must hash to its name.
    /// `workers` I/O threads stream it ([`data_workers`]).
    LoadFrom { file: DataFile, workers: u16 },
    /// Save for a cycle that skips the native checkpoint and restore (`suspend --keep-contexts`):
    /// as Save, and a shim whose carrier setting is `auto` copies through a pinned carrier, which
    /// no native restore will have to re-pin.
    SaveKeepingContexts,
    /// Save into the carrier helper of the shim's control directory instead of the process's own
    /// carrier (`suspend --carrier helper`): the helper, a process that is never checkpointed,
    /// imports each allocation and copies it into memory it keeps pinned, so the process holds
    /// no pinned memory through the native checkpoint. The Load of the cycle copies back from it.
    SaveThroughHelper { native_follows: bool },
    /// To a carrier helper: one allocation of the calling process, its descriptor on this frame,
    /// for the next [`Request::CarrierCopy`] of this connection: its bytes go at (or come from)
    /// `offset` of the caller's carrier; `device` is the UUID of its device.
    CarrierItem {
        offset: u64,
        size: u64,
        device: [u8; 16],
    },
    /// To a carrier helper: copy every item of this connection into the caller's carrier
    /// (`to_host`), made or grown to `total` bytes and kept pinned, or out of it into the items.
    /// Answered with [`Response::Copied`].
    CarrierCopy { to_host: bool, total: u64 },
    /// To a carrier helper: give the caller's carrier back (its pinned memory freed).
    CarrierForget,
    /// Close the submission gate and the tracked-call gate without waiting: from now on the
    /// application's new GPU work and tracked memory calls wait. The first step of every capture,
    /// sent to the whole group before any drain, so that no process's work waits for a peer that
    /// is still submitting. Answered with [`Response::Drain`].
    Hold,
    /// Wait up to `wait_ms` for this process to be drained: nothing on its way into the driver and
    /// every context's work finished. Answered with [`Response::Drain`] either way.
    Drain { wait_ms: u32 },
    /// Let up to `count` submissions waiting at the closed gate through (a peer's stalled drain
    /// waits for them). Answered with [`Response::Drain`] (not waited).
    Admit { count: u32 },
    /// To a carrier helper, after a [`Request::CarrierCopy`] into the caller's carrier: the
    /// carrier itself, a memfd, answered with [`Response::CarrierFd`] and the descriptor. The
    /// caller holds it until its resume, so the saved bytes outlive the helper (a `resume` whose
    /// helper died loads from it).
    CarrierShare,
    /// From the tool to a carrier helper, ahead of the first suspend (`cuinterpose prepare`):
    /// make the carrier of process `pid` (as the helper sees its pid) `bytes` long and pin it in
    /// 256 MiB pieces, so that the first Save through the helper finds it pinned. Answered with
    /// [`Response::Prepared`] once it is.
    CarrierPrepare { pid: u32, bytes: u64 },
    /// To a shim, ahead of the first `suspend --keep-contexts` (`cuinterpose prepare
    /// --keep-contexts`): make this process's own carrier as long as its Save would need now and
    /// pin it in 256 MiB pieces, on the control worker while the application runs (nothing is
    /// held), so that the first keep-contexts Save finds it pinned. Answered with
    /// [`Response::Prepared`] once it is; refused (nothing changed) inside a capture or where
    /// `CUINTERPOSE_CARRIER=staged` never pins.
    PinCarrier,
}

/// The steps of the multicast rebuild, in their order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MulticastStep {
    /// Creators create their multicast objects again and export them into the export cache.
    Create,
    /// Importers import them again from their creators (all before any device is added, so that
    /// no rank waits in a team that another rank has not joined).
    Import,
    /// Every process adds the devices it had added.
    AddDevices,
    /// Bindings are made again and multicast mappings mapped at their addresses with their
    /// access (the team is complete everywhere by now).
    Bind,
}

impl MulticastStep {
    /// Every step, in the order the tool sends them.
    pub const ALL: [MulticastStep; 4] = [
        MulticastStep::Create,
        MulticastStep::Import,
        MulticastStep::AddDevices,
        MulticastStep::Bind,
    ];

    /// The step's name in reports and errors.
    pub fn name(self) -> &'static str {
        match self {
            MulticastStep::Create => "multicast-create",
            MulticastStep::Import => "multicast-import",
            MulticastStep::AddDevices => "multicast-add-devices",
            MulticastStep::Bind => "multicast-bind",
        }
    }
}

/// What a shim answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Hello(HelloReply),
    Records(ProcessRecord),
    /// The descriptor rides on this frame.
    Fd {
        id: AllocationId,
    },
    /// A phase finished: how many bytes it moved and how long it took inside the shim; for the
    /// phases that copy (Save, Load) also how that time was spent.
    PhaseDone {
        phase: Phase,
        bytes: u64,
        micros: u64,
        stats: Option<CopyStats>,
    },
    /// The request failed; nothing the request would have changed was left half done unless the
    /// message says so.
    Error {
        code: ErrorCode,
        message: String,
    },
    /// SaveTo or LoadFrom finished: like PhaseDone, with the layout and digest of the data file
    /// written or read, and how the streaming went.
    Streamed {
        phase: Phase,
        bytes: u64,
        micros: u64,
        stats: StreamStats,
        file: DataFile,
    },
    /// A carrier helper took a [`Request::CarrierItem`] or gave a carrier back.
    Accepted,
    /// A carrier helper's [`Request::CarrierCopy`] finished.
    Copied {
        stats: CopyStats,
    },
    /// How the drain of Hold, Drain or Admit stands.
    Drain(DrainReport),
    /// The caller's carrier ([`Request::CarrierShare`]): a memfd of `length` bytes rides on this
    /// frame; `helper_pid` is the helper's own pid (in the PID namespace of the tool that started
    /// it), what `inspect` names.
    CarrierFd {
        length: u64,
        helper_pid: u32,
    },
    /// A carrier prepared ([`Request::CarrierPrepare`], [`Request::PinCarrier`]): `pinned` bytes
    /// of it are pinned, which took `micros` (0 when it already was).
    Prepared {
        pinned: u64,
        micros: u64,
    },
}

/// How one process's drain stands (Hold, Drain, Admit).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    /// Nothing is on its way into the driver and every context's work has finished.
    pub drained: bool,
    /// Application threads whose submission waits at the closed gate.
    pub waiting: u32,
    /// Submissions admitted through the closed gate since the process started.
    pub admitted: u64,
    /// Held submissions this request let through (Admit; 0 for the others).
    pub granted: u32,
    /// What is not finished, one line each (a context with work running, a submission inside
    /// the driver, tracked calls in flight); empty when drained.
    pub busy: Vec<String>,
    /// Since the gates closed (Hold).
    pub held_micros: u64,
}

/// What one process's data file holds: its allocations one after the other, each starting at a
/// multiple of [`DATA_ALIGN`] (so that every write and read is aligned for `O_DIRECT` and every
/// block of [`DATA_ALIGN`] bytes belongs to one allocation); the gaps between them are holes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataFile {
    /// Length of the file in bytes: the end of the last extent rounded up to [`DATA_ALIGN`].
    pub length: u64,
    /// Every allocation in the file, in file order.
    pub extents: Vec<Extent>,
    /// Blocks of [`DATA_ALIGN`] bytes (by index: file offset / `DATA_ALIGN`) that were all zeros
    /// and were not written: holes in the file, set to zero on the device at load without being
    /// read. Ascending.
    pub zero_blocks: Vec<u64>,
    /// `None`: the bytes are in one file, as laid out above. `Some`: they are in a block store
    /// (SaveTo with `store`): the BLAKE3 of every block of [`DATA_ALIGN`] bytes of that layout
    /// that is not a zero block, in file order, each stored once as the file [`block_path`]
    /// names (the last block of an allocation only as long as the allocation's bytes in it).
    pub blocks: Option<Vec<[u8; 32]>>,
}

impl DataFile {
    /// The blocks of the layout, by index, with the digest of each stored one (`None` for a zero
    /// block) and its length; `None` when the record is not of a block store or its block list
    /// does not match its layout (a count that differs from the blocks that are not zero).
    pub fn stored_blocks(&self) -> Option<Vec<StoredBlock>> {
        let digests = self.blocks.as_ref()?;
        let mut out = Vec::new();
        let mut next = digests.iter();
        for extent in &self.extents {
            let first = extent.offset / DATA_ALIGN;
            let count = extent.size.div_ceil(DATA_ALIGN);
            for index in first..first + count {
                let start = index * DATA_ALIGN;
                let len = (extent.offset + extent.size - start).min(DATA_ALIGN);
                let digest = if self.zero_blocks.binary_search(&index).is_ok() {
                    None
                } else {
                    Some(*next.next()?)
                };
                out.push(StoredBlock { index, len, digest });
            }
        }
        next.next().is_none().then_some(out)
    }
}

/// One block of a [`DataFile`] kept in a block store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBlock {
    /// Index in the layout: file offset / [`DATA_ALIGN`].
    pub index: u64,
    /// Bytes of the allocation in it: [`DATA_ALIGN`], or less for an allocation's last block.
    pub len: u64,
    /// BLAKE3 of those bytes, the block's name in the store; `None` for a zero block (not stored).
    pub digest: Option<[u8; 32]>,
}

/// Path of a block in a block store's directory: `<first two hex digits>/<64 hex digits>` of its
/// BLAKE3 (256 sub-directories keep each directory small).
pub fn block_path(digest: &[u8; 32]) -> String {
    let hex = block_name(digest);
    format!("{}/{hex}", &hex[..2])
}

/// The file name of a block in its sub-directory: its BLAKE3 in 64 lower-case hex digits.
pub fn block_name(digest: &[u8; 32]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// The digest of an allocation kept as blocks ([`Extent::blake3`] in a block store's record):
/// BLAKE3 over its blocks' digests in order, a zero block counted as 32 zero bytes. It binds the
/// allocation to its block list without hashing its bytes a second time (each block is checked
/// against its own digest as it is read).
pub fn block_list_digest(blocks: impl IntoIterator<Item = Option<[u8; 32]>>) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    for block in blocks {
        hasher.update(&block.unwrap_or([0; 32]));
    }
    *hasher.finalize().as_bytes()
}

/// How one process streamed a data file. Times in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamStats {
    /// Bytes written to (SaveTo) or read from (LoadFrom) the file, or the block store (for
    /// SaveTo: the blocks it did not hold yet).
    pub file_bytes: u64,
    /// Bytes of zero blocks neither written nor read (set on the device instead).
    pub zero_bytes: u64,
    /// Whether the file was written or read with `O_DIRECT` to the end.
    pub direct: bool,
    /// I/O threads.
    pub threads: u32,
    /// Wall time of the streaming (threads started to the last block hashed).
    pub micros: u64,
    /// Time the threads spent hashing, summed over them: the digests' share of the streaming is
    /// this over `threads` x `micros` (what they would save at most where the threads, not the
    /// storage, set the pace).
    pub hash_micros: u64,
    /// SaveTo into a block store: bytes of blocks the store already held (written by another
    /// process or checkpoint, or twice in this file), referenced without being written again.
    pub shared_bytes: u64,
    /// Time the threads spent entering device contexts and making and freeing their pinned
    /// buffers and streams, summed over them.
    pub setup_micros: u64,
    /// Time the threads spent in the file's (or the block store's) reads and writes, summed.
    pub io_micros: u64,
    /// Time the threads waited for their copies to or from the device, summed.
    pub wait_micros: u64,
}

/// One allocation's bytes in a data file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub id: AllocationId,
    /// Offset in the file, a multiple of [`DATA_ALIGN`].
    pub offset: u64,
    /// Bytes of the allocation (its whole size).
    pub size: u64,
    /// BLAKE3 of the allocation's `size` bytes (zero blocks as zeros): each allocation is
    /// checked on its own, since a rollback may have to load only some of them.
    pub blake3: [u8; 32],
}

/// Alignment of every extent in a data file, and the size of the zero blocks left out of it:
/// 2 MiB, the allocation granularity of every GPU this project runs on (so aligning costs no file
/// space there) and a multiple of every filesystem's `O_DIRECT` alignment.
pub const DATA_ALIGN: u64 = 2 << 20;
/// Largest write or read of a data file: large enough that each I/O runs at a disk's streaming
/// rate, a multiple of [`DATA_ALIGN`] so that I/Os start on block boundaries. Shared by the shims
/// and by `cuinterpose bench --to-disk`, which measures a directory with the same I/Os.
pub const DATA_IO: u64 = 8 << 20;
/// Fewest I/Os in flight on one data file (one thread each): several keep a disk array's queue
/// busy while one thread copies or hashes.
pub const MIN_DATA_WORKERS: u16 = 4;
/// Most I/O threads of one process's data file.
pub const MAX_DATA_WORKERS: u16 = 32;

/// I/O threads for each of `processes` data files streamed at once on a machine of `cpus` CPUs,
/// at least [`MIN_DATA_WORKERS`] and at most [`MAX_DATA_WORKERS`]. On a disk the threads are the
/// queue depth and spend nearly all their time waiting for it (95% on the H100 machine's disk),
/// so twice the CPUs are shared out. Where the files sit in memory (`in_memory`: tmpfs) reading
/// and hashing are CPU work, and more threads than CPUs only contend: one per CPU (on the H100
/// machine 16 threads read and hashed 2 MiB block files from tmpfs at 38.7 GB/s, 32 at 34.7; and
/// each thread pins its own buffers first). The tool sends it with SaveTo and LoadFrom, and
/// `bench --to-disk` measures the directory with as many.
pub fn data_workers(cpus: usize, processes: usize, in_memory: bool) -> u16 {
    let per_cpu = if in_memory { 1 } else { 2 };
    let share = (per_cpu * cpus) / processes.max(1);
    share.clamp(MIN_DATA_WORKERS as usize, MAX_DATA_WORKERS as usize) as u16
}

/// The carrier helper's socket in a control directory ([`Request::SaveThroughHelper`]).
pub const CARRIER_HELPER_SOCKET: &str = "cuinterpose-carrier.sock";

/// How a shim's copy engine reaches its host carrier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CarrierMode {
    /// DMA into small pinned staging buffers, then a CPU copy to or from the carrier.
    #[default]
    Staged,
    /// DMA straight to or from the carrier, each segment registered (`cuMemHostRegister`) for its
    /// copy and unregistered after it.
    Registered,
    /// DMA straight to or from the carrier, which is registered once, in pieces, when it is
    /// made or grown, and kept registered across cycles.
    Pinned,
}

/// What a copying phase (Save, Load) measured inside one shim. Times in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyStats {
    pub mode: CarrierMode,
    /// Bytes copied between device memory and the carrier.
    pub bytes: u64,
    /// Copy worker threads.
    pub threads: u32,
    /// Carrier mapping and first touch (0 when nothing had to be mapped or touched).
    pub carrier_micros: u64,
    /// The carrier of an earlier cycle was big enough and was used again.
    pub carrier_reused: bool,
    /// The slowest worker's time spent pinning: staging allocation, or registering and
    /// unregistering carrier segments. Part of `copy_micros`.
    pub pin_micros: u64,
    /// Wall time of the copy engine (workers started to last copy confirmed).
    pub copy_micros: u64,
    /// Segments copied through staging because registering them failed (registered mode).
    pub staged_fallbacks: u32,
}

/// A shim's identity, returned by HELLO.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloReply {
    pub shim_version: String,
    pub ns_pid: u32,
    /// SHA-256 of the shim library file as mapped in the process (hex).
    pub shim_sha256: String,
    /// `cuDriverGetVersion` of the driver the shim runs on.
    pub driver_version: i32,
    /// Host memory of the process's carrier held pinned (registered with the driver) between
    /// cycles: what a pinned carrier costs while the process runs.
    pub carrier_pinned_bytes: u64,
    /// This cycle's bytes went through the carrier helper (`suspend --carrier helper`), until the
    /// Thaw: which helper, and the copy this process holds of what it saved there.
    pub carrier_helper: Option<HelperHold>,
}

/// A process's saved bytes in the carrier helper ([`HelloReply::carrier_helper`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelperHold {
    /// The helper's pid as it reported it ([`Response::CarrierFd`]).
    pub helper_pid: u32,
    /// Allocations saved through it in this cycle.
    pub allocations: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes of the helper's carrier this process holds a descriptor of (a memfd, 0 when none):
    /// at least `bytes` when the saved bytes outlive the helper.
    pub held_bytes: u64,
}

/// Why a request failed. Only ever added to, at the end: postcard encodes a variant as its index in
/// declaration order (not a discriminant), so the order is the wire format; `tests/wire_format.rs`
/// pins it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    /// The request is not valid in the shim's current phase.
    WrongPhase,
    /// Unknown allocation (GetFd) or stale ticket.
    NotFound,
    /// The peer is not allowed (uid check).
    Denied,
    /// A driver call failed; the message names it and its CUresult.
    Driver,
    /// Freeze could not quiesce in time.
    Timeout,
    /// A peer needed for this step did not answer.
    Peer,
    /// Anything else inside the shim.
    Internal,
    /// Another tool run holds this process's capture (one capture at a time, whatever the
    /// callers' environments).
    Busy,
    /// A context of the process already holds a sticky error of the application's own work (a
    /// kernel that faulted): it cannot be drained, and nothing was changed.
    Sticky,
}

impl Request {
    pub fn kind(&self) -> u16 {
        match self {
            Request::Hello { .. } => 1,
            Request::Inspect => 2,
            Request::GetFd { .. } => 3,
            Request::Freeze { .. } => 4,
            Request::Save => 5,
            Request::Release => 6,
            Request::Load => 7,
            Request::Import => 8,
            Request::Thaw => 9,
            Request::Multicast(_) => 10,
            Request::SaveTo { .. } => 11,
            Request::LoadFrom { .. } => 12,
            Request::SaveKeepingContexts => 13,
            Request::SaveThroughHelper { .. } => 14,
            Request::CarrierItem { .. } => 15,
            Request::CarrierCopy { .. } => 16,
            Request::CarrierForget => 17,
            Request::Hold => 18,
            Request::Drain { .. } => 19,
            Request::Admit { .. } => 20,
            Request::CarrierShare => 21,
            Request::CarrierPrepare { .. } => 22,
            Request::PinCarrier => 23,
        }
    }

    /// Whether a descriptor rides on this request's frame (exactly when it does: the data file,
    /// or an allocation sent to a carrier helper).
    pub fn carries_fd(&self) -> bool {
        matches!(
            self,
            Request::SaveTo { .. } | Request::LoadFrom { .. } | Request::CarrierItem { .. }
        )
    }
}

impl Response {
    pub fn kind(&self) -> u16 {
        match self {
            Response::Hello(_) => 0x101,
            Response::Records(_) => 0x102,
            Response::Fd { .. } => 0x103,
            Response::PhaseDone { .. } => 0x104,
            Response::Error { .. } => 0x105,
            Response::Streamed { .. } => 0x106,
            Response::Accepted => 0x107,
            Response::Copied { .. } => 0x108,
            Response::Drain(_) => 0x109,
            Response::CarrierFd { .. } => 0x10a,
            Response::Prepared { .. } => 0x10b,
        }
    }

    /// Whether a descriptor rides on this response's frame (exactly when it does: an
    /// allocation from the peer descriptor service, or a carrier from the carrier helper).
    pub fn carries_fd(&self) -> bool {
        matches!(self, Response::Fd { .. } | Response::CarrierFd { .. })
    }
}

/// Kind code of [`Request::GetFd`], for readers that refuse every other request before decoding.
pub const KIND_GET_FD: u16 = 3;

/// Header plus body of a message, ready to send.
pub fn encode_request(request: &Request) -> Vec<u8> {
    encode(request.kind(), request)
}

pub fn encode_response(response: &Response) -> Vec<u8> {
    encode(response.kind(), response)
}

fn encode<T: Serialize>(kind: u16, message: &T) -> Vec<u8> {
    // postcard's serializer into a Vec only fails on types serde cannot describe; ours are plain data.
    let body = postcard::to_stdvec(message).unwrap_or_default();
    let header = FrameHeader {
        version: PROTOCOL_VERSION,
        kind,
        length: body.len() as u32,
    };
    let mut frame = Vec::with_capacity(HEADER_LEN + body.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(&body);
    frame
}

/// Decodes a request body after its header was checked; refuses a body whose variant disagrees with
/// the header's kind or that has trailing bytes.
pub fn decode_request(header: &FrameHeader, body: &[u8]) -> Result<Request, ProtocolError> {
    let request: Request = decode_body(header, body)?;
    if request.kind() != header.kind {
        return Err(ProtocolError::KindMismatch {
            header: header.kind,
            body: request.kind(),
        });
    }
    Ok(request)
}

pub fn decode_response(header: &FrameHeader, body: &[u8]) -> Result<Response, ProtocolError> {
    let response: Response = decode_body(header, body)?;
    if response.kind() != header.kind {
        return Err(ProtocolError::KindMismatch {
            header: header.kind,
            body: response.kind(),
        });
    }
    Ok(response)
}

fn decode_body<'a, T: Deserialize<'a>>(
    header: &FrameHeader,
    body: &'a [u8],
) -> Result<T, ProtocolError> {
    let expected = header.length as usize;
    if body.len() < expected {
        return Err(ProtocolError::Truncated {
            expected,
            got: body.len(),
        });
    }
    if body.len() > expected {
        return Err(ProtocolError::TrailingBytes(body.len() - expected));
    }
    let (message, rest) =
        postcard::take_from_bytes(body).map_err(|e| ProtocolError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(ProtocolError::TrailingBytes(rest.len()));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_workers_share_twice_the_cpus_of_a_disk_and_the_cpus_of_memory_within_bounds() {
        // The H100 machine: 16 CPUs; one process gets 32, a pair 16 each, eight 4 each.
        assert_eq!(data_workers(16, 1, false), 32);
        assert_eq!(data_workers(16, 2, false), 16);
        assert_eq!(data_workers(16, 8, false), MIN_DATA_WORKERS);
        // In memory: one per CPU, 16 for one process, 8 each for a pair.
        assert_eq!(data_workers(16, 1, true), 16);
        assert_eq!(data_workers(16, 2, true), 8);
        // CI's 2 cores: never fewer than the disk's queue needs.
        assert_eq!(data_workers(2, 1, false), MIN_DATA_WORKERS);
        assert_eq!(data_workers(2, 1, true), MIN_DATA_WORKERS);
        // A large host: never more threads than one file's stream can use.
        assert_eq!(data_workers(256, 1, false), MAX_DATA_WORKERS);
        assert_eq!(data_workers(256, 1, true), MAX_DATA_WORKERS);
        assert_eq!(data_workers(8, 0, false), 16, "no processes counts as one");
    }
}
