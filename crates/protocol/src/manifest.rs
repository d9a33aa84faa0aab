//! `manifest.json`: what a checkpoint directory holds, for people and for the restore that reads
//! it back. JSON with every field required and no unknown field allowed; `format` and `version`
//! are read first, so that a file of another format or version is refused by name, not by
//! whatever field it happens to lack.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ProtocolError;
use crate::message::{DATA_ALIGN, DataFile, Extent};
use crate::record::{AllocationId, ProcessRecord};
use crate::state::{self, GroupState};

/// File name of the manifest in a checkpoint directory.
pub const MANIFEST_FILE_NAME: &str = "manifest.json";
/// Value of the `format` field.
pub const MANIFEST_FORMAT: &str = "cuinterpose-manifest";
/// The manifest version this build writes and reads; bumped on any change of its fields, and on a
/// change of the checkpoint directory it describes (4: the image digest list became BLAKE3,
/// `images.b3`, so a version-3 checkpoint's `images.sha256` is refused by name, not as damage;
/// 5: the GPU bytes are in data files the shims stream, `data_files`, not in CRIU's images, and
/// `bytes.saved` counts every allocation the shims created, private ones too, in place of
/// `bytes.shared_saved`; 7: `criu.in_container`; 8: `criu.placement` in its place, with the
/// container's own init as a third case, and link remaps kept as copies in `remaps/`; 9: the GPU
/// bytes in a block store beside the checkpoint by default, `data_files[].blocks` and
/// `shared_bytes`).
pub const MANIFEST_VERSION: u32 = 9;
/// Largest manifest accepted.
pub const MAX_MANIFEST_LEN: usize = 16 << 20;
/// Longest socket path a participant can have listened on (`sun_path` less its NUL).
const MAX_SOCKET_PATH_LEN: usize = 107;

/// The manifest of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`MANIFEST_FORMAT`].
    pub format: String,
    /// Always [`MANIFEST_VERSION`].
    pub version: u32,
    /// When the checkpoint was taken, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Version of the tool that took it.
    pub tool_version: String,
    /// The processes of the group.
    pub participants: Vec<ManifestParticipant>,
    /// The shim library every participant had mapped.
    pub shim: ShimIdentity,
    /// `cuDriverGetVersion` at checkpoint (e.g. 12080).
    pub driver_version: i32,
    /// Byte counts of the capture.
    pub bytes: ByteCounts,
    /// The CRIU dump, when the checkpoint was dumped to disk.
    pub criu: Option<CriuInfo>,
    /// Wall-clock time of each phase, in the order the phases ran.
    pub timings: Vec<PhaseTiming>,
    /// The state file beside the manifest.
    pub state: StateFileRef,
    /// The data files beside the manifest: one per process that created shared allocations,
    /// holding their bytes (checkpoint to disk).
    pub data_files: Vec<DataFileEntry>,
}

/// One process's data file: the bytes of its shared allocations, which its shim streamed there
/// and reads back at restore (`protocol::message::DataFile` in JSON). With `blocks`, the file is
/// not in the checkpoint: its blocks are in the block store beside it (`<parent>/`
/// [`BLOCK_STORE_DIR`]), and `file` only names the entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFileEntry {
    /// File name in the checkpoint directory (no directory part): `gpu-<ns pid>.data`.
    pub file: String,
    /// Namespace PID of the participant that wrote it (and reads it back).
    pub ns_pid: u32,
    /// Length of the file in bytes.
    pub bytes: u64,
    /// Bytes actually written: the rest are zero blocks left as holes, or (in a block store)
    /// blocks the store already held.
    pub written_bytes: u64,
    /// In a block store: bytes of blocks the store already held when the checkpoint wrote them
    /// (another checkpoint's, another process's, or the same block twice), not written again.
    pub shared_bytes: u64,
    /// The allocations in the file, in file order.
    pub extents: Vec<DataExtent>,
    /// Blocks of [`DATA_ALIGN`] bytes (by index) that were all zeros and were not written.
    pub zero_blocks: Vec<u64>,
    /// `None`: the bytes are in `data/<file>`. Otherwise the BLAKE3 of every block that is not a
    /// zero block, in file order, 64 lower-case hex digits each: the block's name in the block
    /// store ([`crate::message::block_path`]). The manifest is signed, so the signature covers
    /// every block a restore reads.
    pub blocks: Option<Vec<String>>,
}

/// Directory of the block store beside the checkpoints of one storage directory: the
/// checkpoint `DIR` keeps its blocks in `<parent of DIR>/.cuinterpose-blocks`.
pub const BLOCK_STORE_DIR: &str = ".cuinterpose-blocks";

/// One allocation in a data file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataExtent {
    /// The allocation ID, 32 lower-case hex digits.
    pub id: String,
    /// Offset in the file, a multiple of [`DATA_ALIGN`].
    pub offset: u64,
    pub size: u64,
    /// BLAKE3 of its `size` bytes (zero blocks as zeros), 64 lower-case hex digits.
    pub blake3: String,
}

/// Name of the data file of the participant with namespace PID `ns_pid`.
pub fn data_file_name(ns_pid: u32) -> String {
    format!("gpu-{ns_pid}.data")
}

impl DataFileEntry {
    /// The entry of what the shim of `ns_pid` answered to SaveTo.
    pub fn new(
        ns_pid: u32,
        written_bytes: u64,
        shared_bytes: u64,
        record: &DataFile,
    ) -> DataFileEntry {
        DataFileEntry {
            file: data_file_name(ns_pid),
            ns_pid,
            bytes: record.length,
            written_bytes,
            shared_bytes,
            extents: record
                .extents
                .iter()
                .map(|e| DataExtent {
                    id: hex(&e.id.0),
                    offset: e.offset,
                    size: e.size,
                    blake3: hex(&e.blake3),
                })
                .collect(),
            zero_blocks: record.zero_blocks.clone(),
            blocks: record
                .blocks
                .as_ref()
                .map(|b| b.iter().map(|d| hex(d)).collect()),
        }
    }

    /// The record the shim wrote, to send back with LoadFrom.
    pub fn record(&self) -> Result<DataFile, ProtocolError> {
        let extents = self
            .extents
            .iter()
            .map(|e| {
                Ok(Extent {
                    id: AllocationId(unhex(&e.id)?),
                    offset: e.offset,
                    size: e.size,
                    blake3: unhex(&e.blake3)?,
                })
            })
            .collect::<Result<Vec<_>, ProtocolError>>()?;
        let blocks = match &self.blocks {
            None => None,
            Some(b) => Some(
                b.iter()
                    .map(|d| unhex::<32>(d))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(DataFile {
            length: self.bytes,
            extents,
            zero_blocks: self.zero_blocks.clone(),
            blocks,
        })
    }

    /// Checks the entry on its own: a plain file name of the form [`data_file_name`] gives; the
    /// extents well formed (hex), aligned, in order, apart and inside the file; zero blocks
    /// ascending, inside the extents; no more written bytes than the extents hold.
    fn validate(&self) -> Result<(), String> {
        if self.file != data_file_name(self.ns_pid) {
            return Err(format!(
                "data file {:?} of namespace pid {} is not named {:?}",
                self.file,
                self.ns_pid,
                data_file_name(self.ns_pid)
            ));
        }
        let mut end = 0u64;
        let mut held = 0u64;
        for e in &self.extents {
            if unhex::<16>(&e.id).is_err() || unhex::<32>(&e.blake3).is_err() {
                return Err(format!(
                    "{}: extent {:?} has an id or digest that is not lower-case hex of its size",
                    self.file, e.id
                ));
            }
            let past = e.offset.checked_add(e.size);
            if e.offset % DATA_ALIGN != 0 || e.offset < end || past.is_none_or(|p| p > self.bytes) {
                return Err(format!(
                    "{}: extent {} at {} of {} bytes is not aligned, in order and inside the                      file's {} bytes",
                    self.file, e.id, e.offset, e.size, self.bytes
                ));
            }
            end = past.unwrap_or(u64::MAX);
            held = held.saturating_add(e.size);
        }
        if self.written_bytes.saturating_add(self.shared_bytes) > held {
            return Err(format!(
                "{}: {} bytes written and {} shared of extents holding {held}",
                self.file, self.written_bytes, self.shared_bytes
            ));
        }
        if let Some(blocks) = &self.blocks {
            // Each names a file a restore opens in the store, and discard's collection keeps:
            // nothing but a digest may name one (no `/`, no `..`, no other directory).
            if let Some(bad) = blocks.iter().find(|d| unhex::<32>(d).is_err()) {
                return Err(format!(
                    "{}: block {bad:?} is not a BLAKE3 digest (64 lower-case hex digits)",
                    self.file
                ));
            }
        }
        let inside = |b: u64| {
            let at = b.saturating_mul(DATA_ALIGN);
            self.extents
                .iter()
                .any(|e| e.offset <= at && at < e.offset.saturating_add(e.size))
        };
        let ascending = self.zero_blocks.windows(2).all(|w| w[0] < w[1]);
        if !ascending || !self.zero_blocks.iter().all(|&b| inside(b)) {
            return Err(format!(
                "{}: zero blocks not ascending or outside the extents",
                self.file
            ));
        }
        if self.blocks.is_some() {
            let listed = self.record().ok().and_then(|r| r.stored_blocks());
            if listed.is_none() {
                return Err(format!(
                    "{}: the block list does not have one digest per block that is not a zero \
                     block",
                    self.file
                ));
            }
        }
        Ok(())
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

fn unhex<const N: usize>(s: &str) -> Result<[u8; N], ProtocolError> {
    let bad =
        || ProtocolError::Inconsistent(format!("{s:?} is not {} lower-case hex digits", 2 * N));
    let digit = |b: u8| match b {
        b'0'..=b'9' => Ok(b - b'0'),
        b'a'..=b'f' => Ok(b - b'a' + 10),
        _ => Err(bad()),
    };
    let bytes = s.as_bytes();
    if bytes.len() != 2 * N {
        return Err(bad());
    }
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        if let [hi, lo] = *pair {
            *o = (digit(hi)? << 4) | digit(lo)?;
        }
    }
    Ok(out)
}

/// One process of the group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestParticipant {
    /// PID in the tool's (host) PID namespace.
    pub host_pid: u32,
    /// PID in the process's own PID namespace.
    pub ns_pid: u32,
    /// `/proc/<pid>/cmdline`, one element per argument (lossy UTF-8).
    pub command_line: Vec<String>,
    /// What the process does with shared memory.
    pub role: Role,
    /// The GPUs the process saw, by its own device ordinal: ordinals are per process
    /// (`CUDA_VISIBLE_DEVICES` may differ between processes), so they are recorded per process.
    pub gpus: Vec<GpuInfo>,
    /// Paths of the Unix sockets the process listened on, as it names them. CRIU binds them again
    /// on restore, so a restore removes the stale files first (after checking nothing answers).
    #[serde(default)]
    pub sockets: Vec<String>,
}

/// What a process does with shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Creates shared allocations and imports none.
    Creator,
    /// Imports allocations and shares none of its own.
    Importer,
    /// Both creates shared allocations and imports.
    CreatorAndImporter,
    /// Neither: its device memory is private.
    Private,
}

impl Role {
    /// The role a record shows.
    pub fn of(record: &ProcessRecord) -> Role {
        let creates = record.allocations.iter().any(|a| a.shared);
        let imports = !record.imports.is_empty();
        match (creates, imports) {
            (true, true) => Role::CreatorAndImporter,
            (true, false) => Role::Creator,
            (false, true) => Role::Importer,
            (false, false) => Role::Private,
        }
    }
}

/// A GPU as one process saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuInfo {
    /// The process's `CUdevice` ordinal.
    pub ordinal: u32,
    /// `cuDeviceGetUuid`, as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
}

/// The shim library.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShimIdentity {
    /// Absolute path of the library as the processes mapped it.
    pub path: String,
    /// Its SHA-256, 64 lower-case hex digits; a restore requires the identical library.
    pub sha256: String,
}

/// Byte counts of the capture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByteCounts {
    /// Bytes of the allocations the shims created (shared or private) copied into host carriers.
    pub saved: u64,
    /// Bytes the host carriers hold in total (at least `saved`).
    pub carriers: u64,
}

/// The CRIU dump.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriuInfo {
    /// `criu --version`.
    pub version: String,
    /// Total size of the image files.
    pub image_bytes: u64,
    /// The hard links CRIU made at dump time for files deleted while open that still had another
    /// name: the images restore through them.
    pub link_remaps: Vec<LinkRemap>,
    /// Whether the images hold established TCP connections (every one with its other end in the
    /// tree), which the restore must ask CRIU for.
    pub tcp_established: bool,
    /// The namespaces the tree shared with processes outside it at the dump (a pod's sandbox
    /// holds its network, IPC and UTS namespaces), in the order of [`SharedNamespace`]. The
    /// network namespace is dumped as external (CRIU cannot take a pod's interfaces), so a
    /// restore must be given one to join; IPC and UTS are in the images and are joined instead
    /// when the restore is told whose namespaces to enter.
    pub shared_namespaces: Vec<SharedNamespace>,
    /// Where CRIU ran for the tree; a restore must run it the same way, in a container when the
    /// tree ran in one.
    pub placement: CriuPlacement,
}

/// Where CRIU ran for a dump, and so where a restore runs it (crate users: `control::container`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CriuPlacement {
    /// In the tool's namespaces: the tree ran in the tool's root filesystem.
    Host,
    /// Inside the container's mount and PID namespaces: the tree was the init of a PID namespace
    /// below its container's (`cuinterpose run --pid-namespace` inside the container).
    BelowContainerInit,
    /// In the tool's PID namespace, in a private copy of the container's mount namespace: the
    /// tree was its container's own init (an ordinary pod's process).
    ContainerInit {
        /// The mount points of the tree's mount namespace that showed filesystems of the node
        /// (the pod's volumes, the runtime's bind mounts), in the order of their CRIU keys:
        /// dumped as external, and taken at a restore from the container restored into, at the
        /// same paths.
        node_mounts: Vec<String>,
    },
}

impl CriuPlacement {
    /// Whether the tree ran in a container (a root directory other than the tool's).
    pub fn in_container(&self) -> bool {
        !matches!(self, CriuPlacement::Host)
    }
}

/// A namespace a tree may share with the processes around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedNamespace {
    Net,
    Ipc,
    Uts,
}

impl SharedNamespace {
    pub const ALL: [SharedNamespace; 3] = [
        SharedNamespace::Net,
        SharedNamespace::Ipc,
        SharedNamespace::Uts,
    ];

    /// The name in `/proc/PID/ns/` and in CRIU's options.
    pub fn name(self) -> &'static str {
        match self {
            SharedNamespace::Net => "net",
            SharedNamespace::Ipc => "ipc",
            SharedNamespace::Uts => "uts",
        }
    }
}

/// One of CRIU's link remaps. CRIU names it `<dir>/link_remap.<id>` with an id that the next dump
/// reuses, so the tool keeps the file under a name of this checkpoint's own and links it back to
/// CRIU's name only while a restore runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkRemap {
    /// CRIU's name, as the images have it: an absolute path ending in `link_remap.<id>`, in the
    /// tree's mount namespace.
    pub link: String,
    /// Where the tool keeps the file until the checkpoint is discarded. For a tree in the tool's
    /// root filesystem, beside it: `link_remap.<id>.cuinterpose-<16 hex digits>` in the same
    /// directory (absolute). For a tree in a container, a copy in the checkpoint directory,
    /// [`REMAPS_DIR`]`/link_remap.<id>` (relative to it): the file lives in the container's
    /// filesystems (a pod's `/dev/shm`), which a restore into another container does not share.
    pub kept_as: String,
}

/// The directory of a checkpoint that holds copies of the link remaps of a tree in a container.
pub const REMAPS_DIR: &str = "remaps";

impl LinkRemap {
    /// Whether the file is kept as a copy in the checkpoint directory (a tree in a container).
    pub fn is_copy(&self) -> bool {
        !self.kept_as.starts_with('/')
    }

    /// Whether both names are what the tool writes. A restore links and removes files at these
    /// paths, so a manifest must not be able to name any other file.
    pub fn is_well_formed(&self) -> bool {
        let plain =
            |p: &str| p.starts_with('/') && !p.contains('\0') && !p.split('/').any(|c| c == "..");
        let Some((dir, name)) = self.link.rsplit_once('/') else {
            return false;
        };
        let criu_name = name
            .strip_prefix("link_remap.")
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()));
        let kept_beside = self
            .kept_as
            .strip_prefix(&format!("{dir}/{name}.cuinterpose-"))
            .is_some_and(|tag| tag.len() == 16 && tag.bytes().all(|b| b.is_ascii_hexdigit()));
        let kept_copy = self.kept_as == format!("{REMAPS_DIR}/{name}");
        plain(&self.link) && criu_name && (kept_beside || kept_copy)
    }
}

/// How long one phase took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseTiming {
    /// The phase's name (`freeze`, `save`, `native`, ...), unique in the manifest.
    pub phase: String,
    /// Milliseconds.
    pub ms: u64,
}

/// The state file the manifest describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFileRef {
    /// File name in the checkpoint directory (no directory part), normally
    /// [`state::STATE_FILE_NAME`].
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its SHA-256, 64 lower-case hex digits: a replaced or edited state file is refused.
    pub sha256: String,
}

/// Just the fields read before anything else.
#[derive(Deserialize)]
struct Preamble {
    format: Option<serde_json::Value>,
    version: Option<serde_json::Value>,
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl ManifestParticipant {
    /// Nonzero PIDs, sockets that are plain absolute paths, GPUs once each with a UUID.
    fn validate(&self) -> Result<(), ProtocolError> {
        if self.host_pid == 0 || self.ns_pid == 0 {
            return inconsistent(format!(
                "participant with pid 0 (host {}, namespace {})",
                self.host_pid, self.ns_pid
            ));
        }
        for socket in &self.sockets {
            let plain = socket.starts_with('/')
                && socket.len() <= MAX_SOCKET_PATH_LEN
                && !socket.contains('\0')
                && !socket.split('/').any(|c| c == "..");
            if !plain {
                return inconsistent(format!(
                    "participant {}: socket {socket:?} is not an absolute path of at most {MAX_SOCKET_PATH_LEN} bytes without `..`",
                    self.host_pid
                ));
            }
        }
        let mut ordinals = BTreeSet::new();
        for gpu in &self.gpus {
            if !ordinals.insert(gpu.ordinal) {
                return inconsistent(format!(
                    "participant {}: gpu ordinal {} appears twice",
                    self.host_pid, gpu.ordinal
                ));
            }
            if gpu.uuid.is_empty() {
                return inconsistent(format!(
                    "participant {}: gpu {} has no uuid",
                    self.host_pid, gpu.ordinal
                ));
            }
        }
        Ok(())
    }
}

impl CriuInfo {
    /// A version, well-formed link remaps, shared namespaces in order and once each.
    fn validate(&self) -> Result<(), ProtocolError> {
        if self.version.is_empty() {
            return inconsistent("empty criu version".into());
        }
        if let Some(remap) = self.link_remaps.iter().find(|r| !r.is_well_formed()) {
            return inconsistent(format!(
                "link remap {:?} kept as {:?}: not a link_remap.<id> file and its kept name \
                 in the same directory",
                remap.link, remap.kept_as
            ));
        }
        if !self.shared_namespaces.is_sorted_by(|a, b| a < b) {
            return inconsistent(format!(
                "shared namespaces {:?}: not in order, or one twice",
                self.shared_namespaces
            ));
        }
        Ok(())
    }
}

/// A manifest that contradicts itself.
fn inconsistent<T>(message: String) -> Result<T, ProtocolError> {
    Err(ProtocolError::Inconsistent(message))
}

impl Manifest {
    /// Checks the manifest's internal consistency:
    ///
    /// - `format` and `version` are this build's;
    /// - at least one participant; PIDs nonzero; host and namespace PIDs unique; per participant,
    ///   GPU ordinals unique and UUIDs non-empty, socket paths absolute, without `..` and short
    ///   enough to be socket paths (a restore removes stale files at those paths);
    /// - the shim path is absolute and its digest well formed; the driver version is positive;
    /// - carriers hold at least the bytes saved;
    /// - the CRIU version, when present, is non-empty, and its link remaps are well formed
    ///   ([`LinkRemap::is_well_formed`]); phase names are non-empty and unique;
    /// - the state file is a plain file name (no directory, so a manifest cannot point a restore
    ///   at another file) with a well-formed digest;
    /// - each data file belongs to one participant, at most one per participant, and is well
    ///   formed on its own ([`DataFileEntry`]: its name, extents and zero blocks).
    pub fn validate(&self) -> Result<(), ProtocolError> {
        self.validate_header()?;
        let ns_pids = self.validate_participants()?;
        self.validate_origin()?;
        if let Some(criu) = &self.criu {
            criu.validate()?;
        }
        let mut phases = BTreeSet::new();
        for t in &self.timings {
            if t.phase.is_empty() {
                return inconsistent("a timing without a phase name".into());
            }
            if !phases.insert(t.phase.as_str()) {
                return inconsistent(format!("phase {:?} timed twice", t.phase));
            }
        }
        self.validate_files(&ns_pids)
    }

    /// The format, its version, the tool's version, at least one participant.
    fn validate_header(&self) -> Result<(), ProtocolError> {
        if self.format != MANIFEST_FORMAT {
            return Err(ProtocolError::WrongFormat {
                expected: MANIFEST_FORMAT,
                found: self.format.clone(),
            });
        }
        if self.version != MANIFEST_VERSION {
            return Err(ProtocolError::ManifestVersion {
                ours: MANIFEST_VERSION,
                theirs: self.version,
            });
        }
        if self.tool_version.is_empty() {
            return inconsistent("empty tool version".into());
        }
        if self.participants.is_empty() {
            return inconsistent("no participants".into());
        }
        Ok(())
    }

    /// Each participant well formed and once (by host and by namespace PID): their namespace PIDs.
    fn validate_participants(&self) -> Result<BTreeSet<u32>, ProtocolError> {
        let mut host_pids = BTreeSet::new();
        let mut ns_pids = BTreeSet::new();
        for p in &self.participants {
            p.validate()?;
            if !host_pids.insert(p.host_pid) {
                return inconsistent(format!("host pid {} appears twice", p.host_pid));
            }
            if !ns_pids.insert(p.ns_pid) {
                return inconsistent(format!("namespace pid {} appears twice", p.ns_pid));
            }
        }
        Ok(ns_pids)
    }

    /// Where the checkpoint came from: the shim's path and digest, the driver, the byte counts.
    fn validate_origin(&self) -> Result<(), ProtocolError> {
        if !self.shim.path.starts_with('/') {
            return inconsistent(format!("shim path {:?} is not absolute", self.shim.path));
        }
        if !crate::is_sha256_hex(&self.shim.sha256) {
            return inconsistent(format!(
                "shim sha-256 {:?} is not 64 lower-case hex digits",
                self.shim.sha256
            ));
        }
        if self.driver_version <= 0 {
            return inconsistent(format!("driver version {}", self.driver_version));
        }
        if self.bytes.saved > self.bytes.carriers {
            return inconsistent(format!(
                "{} bytes saved into carriers of {} bytes",
                self.bytes.saved, self.bytes.carriers
            ));
        }
        Ok(())
    }

    /// The state file a plain name with a digest, each data file of a participant, one each.
    fn validate_files(&self, ns_pids: &BTreeSet<u32>) -> Result<(), ProtocolError> {
        let file = self.state.file.as_str();
        if file.is_empty() || file == "." || file == ".." || file.contains(['/', '\0']) {
            return inconsistent(format!("state file {file:?} is not a plain file name"));
        }
        let mut writers = BTreeSet::new();
        for d in &self.data_files {
            d.validate().map_err(ProtocolError::Inconsistent)?;
            if !ns_pids.contains(&d.ns_pid) || !writers.insert(d.ns_pid) {
                return inconsistent(format!(
                    "data file {:?}: namespace pid {} is not a participant, or has two files",
                    d.file, d.ns_pid
                ));
            }
        }
        if !crate::is_sha256_hex(&self.state.sha256) {
            return inconsistent(format!(
                "state sha-256 {:?} is not 64 lower-case hex digits",
                self.state.sha256
            ));
        }
        Ok(())
    }

    /// Checks the bytes of the state file against the manifest and decodes them: size and SHA-256
    /// as recorded, a valid state ([`state::decode`]), the same participants (host and namespace
    /// PIDs) with the roles their records show and the manifest's shim digest, and carriers adding
    /// up to the manifest's carrier bytes.
    pub fn verify_state(&self, state_file: &[u8]) -> Result<GroupState, ProtocolError> {
        if state_file.len() as u64 != self.state.bytes {
            return Err(ProtocolError::Inconsistent(format!(
                "state file is {} bytes, the manifest says {}",
                state_file.len(),
                self.state.bytes
            )));
        }
        let found = sha256_hex(state_file);
        if found != self.state.sha256 {
            return Err(ProtocolError::DigestMismatch {
                what: self.state.file.clone(),
                expected: self.state.sha256.clone(),
                found,
            });
        }
        let group = state::decode(state_file)?;
        let bad = |msg: String| Err(ProtocolError::Inconsistent(msg));
        if group.participants.len() != self.participants.len() {
            return bad(format!(
                "the state has {} participants, the manifest {}",
                group.participants.len(),
                self.participants.len()
            ));
        }
        for p in &self.participants {
            let Some(s) = group.participants.iter().find(|s| s.host_pid == p.host_pid) else {
                return bad(format!("host pid {} is not in the state", p.host_pid));
            };
            if s.ns_pid != p.ns_pid {
                return bad(format!(
                    "host pid {}: namespace pid {} in the manifest, {} in the state",
                    p.host_pid, p.ns_pid, s.ns_pid
                ));
            }
            let role = Role::of(&s.record);
            if role != p.role {
                return bad(format!(
                    "host pid {}: role {:?} in the manifest, {role:?} in the state",
                    p.host_pid, p.role
                ));
            }
            if s.shim_sha256 != self.shim.sha256 {
                return bad(format!(
                    "host pid {} ran shim {}, the manifest names {}",
                    p.host_pid, s.shim_sha256, self.shim.sha256
                ));
            }
        }
        let carriers: u64 = group
            .participants
            .iter()
            .flat_map(|p| &p.carriers)
            .map(|c| c.bytes)
            .fold(0u64, u64::saturating_add);
        if carriers != self.bytes.carriers {
            return bad(format!(
                "the state's carriers hold {carriers} bytes, the manifest says {}",
                self.bytes.carriers
            ));
        }
        Ok(group)
    }
}

/// The manifest as pretty-printed JSON with a final newline.
pub fn encode(manifest: &Manifest) -> Vec<u8> {
    // serde_json fails only on maps with non-string keys or failing Serialize impls; the manifest
    // has neither.
    let mut out = serde_json::to_vec_pretty(manifest).expect("serde_json encodes plain data");
    out.push(b'\n');
    out
}

/// Decodes and validates a manifest. Refuses, in this order: more than [`MAX_MANIFEST_LEN`] bytes,
/// input that is not a JSON object, a missing or other `format`, a missing or other `version`, any
/// missing, unknown or mistyped field, and a manifest that fails [`Manifest::validate`].
pub fn decode(bytes: &[u8]) -> Result<Manifest, ProtocolError> {
    if bytes.len() > MAX_MANIFEST_LEN {
        return Err(ProtocolError::TooLarge {
            length: bytes.len() as u64,
            limit: MAX_MANIFEST_LEN as u64,
        });
    }
    let malformed = |e: serde_json::Error| ProtocolError::Malformed(e.to_string());
    let preamble: Preamble = serde_json::from_slice(bytes).map_err(malformed)?;
    match preamble.format {
        Some(serde_json::Value::String(f)) if f == MANIFEST_FORMAT => {}
        other => {
            return Err(ProtocolError::WrongFormat {
                expected: MANIFEST_FORMAT,
                found: match other {
                    Some(serde_json::Value::String(f)) => f,
                    Some(v) => v.to_string(),
                    None => String::new(),
                },
            });
        }
    }
    match preamble
        .version
        .as_ref()
        .and_then(serde_json::Value::as_u64)
    {
        Some(v) if v == u64::from(MANIFEST_VERSION) => {}
        Some(v) => {
            return Err(ProtocolError::ManifestVersion {
                ours: MANIFEST_VERSION,
                theirs: u32::try_from(v).unwrap_or(u32::MAX),
            });
        }
        None => {
            return Err(ProtocolError::Malformed(
                "manifest version missing or not an unsigned integer".into(),
            ));
        }
    }
    let manifest: Manifest = serde_json::from_slice(bytes).map_err(malformed)?;
    manifest.validate()?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::StoredBlock;
    use crate::state::tests::two_workers;

    fn sample() -> (Manifest, Vec<u8>) {
        let state_file = state::encode(&two_workers());
        let manifest = Manifest {
            format: MANIFEST_FORMAT.into(),
            version: MANIFEST_VERSION,
            created_unix_ms: 1_767_225_600_000,
            tool_version: "0.1.0".into(),
            participants: vec![
                ManifestParticipant {
                    host_pid: 1041,
                    ns_pid: 41,
                    command_line: vec!["python".into(), "worker.py".into(), "--rank=0".into()],
                    role: Role::Creator,
                    gpus: vec![GpuInfo {
                        ordinal: 0,
                        uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                    }],
                    sockets: vec!["/tmp/cuinterpose-41.sock".into()],
                },
                ManifestParticipant {
                    host_pid: 1042,
                    ns_pid: 42,
                    command_line: vec!["python".into(), "worker.py".into(), "--rank=1".into()],
                    role: Role::Importer,
                    gpus: vec![
                        GpuInfo {
                            ordinal: 0,
                            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                        },
                        GpuInfo {
                            ordinal: 1,
                            uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
                        },
                    ],
                    sockets: vec![],
                },
            ],
            shim: ShimIdentity {
                path: "/usr/lib/cuinterpose/libcuinterpose.so".into(),
                sha256: "0f".repeat(32),
            },
            driver_version: 12080,
            bytes: ByteCounts {
                // The state's creator carries its shared 2 MiB and its private 4 KiB.
                saved: (2 << 20) + 4096,
                carriers: (2 << 20) + 4096,
            },
            criu: Some(CriuInfo {
                version: "4.1".into(),
                image_bytes: 123_456_789,
                link_remaps: vec![LinkRemap {
                    link: "/dev/shm/link_remap.23".into(),
                    kept_as: "/dev/shm/link_remap.23.cuinterpose-0123456789abcdef".into(),
                }],
                tcp_established: true,
                shared_namespaces: vec![SharedNamespace::Net, SharedNamespace::Uts],
                placement: CriuPlacement::Host,
            }),
            timings: vec![
                PhaseTiming {
                    phase: "freeze".into(),
                    ms: 3,
                },
                PhaseTiming {
                    phase: "save".into(),
                    ms: 40,
                },
            ],
            state: StateFileRef {
                file: state::STATE_FILE_NAME.into(),
                bytes: state_file.len() as u64,
                sha256: sha256_hex(&state_file),
            },
            data_files: vec![DataFileEntry::new(
                41,
                2 << 20,
                0,
                &DataFile {
                    length: 4 << 20,
                    extents: vec![Extent {
                        id: AllocationId([0xa1; 16]),
                        offset: 0,
                        size: 4 << 20,
                        blake3: [7; 32],
                    }],
                    zero_blocks: vec![1],
                    blocks: Some(vec![[0x3c; 32]]),
                },
            )],
        };
        (manifest, state_file)
    }

    fn json(manifest: &Manifest) -> serde_json::Value {
        serde_json::from_slice(&encode(manifest)).unwrap()
    }

    fn decode_value(v: &serde_json::Value) -> Result<Manifest, ProtocolError> {
        decode(&serde_json::to_vec(v).unwrap())
    }

    #[test]
    fn round_trip_and_state_verification() {
        let (manifest, state_file) = sample();
        manifest.validate().unwrap();
        let bytes = encode(&manifest);
        assert!(bytes.ends_with(b"}\n"));
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.contains("\"format\": \"cuinterpose-manifest\""),
            "{text}"
        );
        assert!(text.contains("\"role\": \"creator\""), "{text}");
        let decoded = decode(&bytes).unwrap();
        assert_eq!(decoded, manifest);
        assert_eq!(encode(&decoded), bytes);
        assert_eq!(decoded.verify_state(&state_file).unwrap(), two_workers());
    }

    #[test]
    fn sockets_default_to_none_when_absent() {
        let (manifest, _) = sample();
        let mut v = json(&manifest);
        v["participants"][0]
            .as_object_mut()
            .unwrap()
            .remove("sockets");
        let decoded = decode_value(&v).unwrap();
        assert!(decoded.participants[0].sockets.is_empty());
    }

    #[test]
    fn criu_may_be_absent_but_not_omitted_silently_as_another_key() {
        let (mut manifest, _) = sample();
        manifest.criu = None;
        let bytes = encode(&manifest);
        assert!(
            std::str::from_utf8(&bytes)
                .unwrap()
                .contains("\"criu\": null")
        );
        assert_eq!(decode(&bytes).unwrap(), manifest);
    }

    #[test]
    fn link_remaps_name_only_criu_link_files_and_their_kept_names() {
        let remap = |link: &str, kept_as: &str| LinkRemap {
            link: link.into(),
            kept_as: kept_as.into(),
        };
        let tag = "0123456789abcdef";
        for good in [
            remap(
                "/dev/shm/link_remap.23",
                &format!("/dev/shm/link_remap.23.cuinterpose-{tag}"),
            ),
            remap("/link_remap.1", &format!("/link_remap.1.cuinterpose-{tag}")),
            remap("/dev/shm/link_remap.23", "remaps/link_remap.23"),
        ] {
            assert!(good.is_well_formed(), "{good:?}");
        }
        assert!(remap("/dev/shm/link_remap.23", "remaps/link_remap.23").is_copy());
        assert!(!remap("/link_remap.1", &format!("/link_remap.1.cuinterpose-{tag}")).is_copy());
        for bad in [
            remap(
                "dev/shm/link_remap.23",
                &format!("dev/shm/link_remap.23.cuinterpose-{tag}"),
            ),
            remap(
                "/a/../link_remap.1",
                &format!("/a/../link_remap.1.cuinterpose-{tag}"),
            ),
            remap("/etc/passwd", &format!("/etc/passwd.cuinterpose-{tag}")),
            remap(
                "/dev/shm/link_remap.",
                &format!("/dev/shm/link_remap..cuinterpose-{tag}"),
            ),
            remap(
                "/dev/shm/link_remap.1x",
                &format!("/dev/shm/link_remap.1x.cuinterpose-{tag}"),
            ),
            remap("/dev/shm/link_remap.1", "/etc/passwd"),
            remap(
                "/dev/shm/link_remap.1",
                &format!("/tmp/link_remap.1.cuinterpose-{tag}"),
            ),
            remap(
                "/dev/shm/link_remap.1",
                "/dev/shm/link_remap.1.cuinterpose-xyz",
            ),
            remap("/dev/shm/link_remap.1", "remaps/link_remap.2"),
            remap("/dev/shm/link_remap.1", "remaps/../link_remap.1"),
            remap("/dev/shm/link_remap.1", "link_remap.1"),
        ] {
            assert!(!bad.is_well_formed(), "{bad:?}");
            let (mut manifest, _) = sample();
            manifest.criu.as_mut().unwrap().link_remaps = vec![bad.clone()];
            assert!(
                matches!(manifest.validate(), Err(ProtocolError::Inconsistent(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn data_file_entries_round_trip_and_bad_ones_are_refused() {
        let (manifest, _) = sample();
        let entry = &manifest.data_files[0];
        let record = entry.record().unwrap();
        assert_eq!(
            DataFileEntry::new(41, entry.written_bytes, entry.shared_bytes, &record),
            *entry
        );
        assert_eq!(entry.extents[0].id, "a1".repeat(16));
        assert_eq!(
            record.stored_blocks().unwrap(),
            vec![
                StoredBlock {
                    index: 0,
                    len: 2 << 20,
                    digest: Some([0x3c; 32])
                },
                StoredBlock {
                    index: 1,
                    len: 2 << 20,
                    digest: None
                },
            ]
        );
        type Edit = fn(&mut DataFileEntry);
        let edits: [(&str, Edit); 14] = [
            ("another name", |e| e.file = "../gpu-41.data".into()),
            ("another participant", |e| {
                e.ns_pid = 43;
                e.file = data_file_name(43);
            }),
            ("a digest that is not hex", |e| {
                e.extents[0].blake3 = "x".repeat(64)
            }),
            ("a short id", |e| e.extents[0].id = "a1".into()),
            ("an unaligned extent", |e| e.extents[0].offset = 4096),
            ("an extent past the end", |e| e.bytes = 2 << 20),
            ("more written than held", |e| e.written_bytes = 8 << 20),
            ("a zero block outside the extents", |e| {
                e.zero_blocks = vec![5]
            }),
            ("zero blocks out of order", |e| e.zero_blocks = vec![1, 0]),
            ("more shared than held", |e| e.shared_bytes = 3 << 20),
            ("a block named by a path outside the store", |e| {
                e.blocks = Some(vec![format!("../../../etc/{}", "3c".repeat(26))])
            }),
            ("a block named in upper case", |e| {
                e.blocks = Some(vec!["3C".repeat(32)])
            }),
            ("a block missing from the list", |e| e.blocks = Some(vec![])),
            ("a block too many", |e| {
                e.blocks = Some(vec!["3c".repeat(32), "3d".repeat(32)])
            }),
        ];
        for (what, edit) in edits {
            let mut bad = manifest.clone();
            edit(&mut bad.data_files[0]);
            assert!(
                matches!(bad.validate(), Err(ProtocolError::Inconsistent(_))),
                "{what}: {:?}",
                bad.validate()
            );
        }
        let mut twice = manifest.clone();
        twice.data_files.push(twice.data_files[0].clone());
        assert!(twice.validate().is_err(), "two files of one participant");
    }

    #[test]
    fn shared_namespaces_are_listed_once_in_order() {
        let (manifest, _) = sample();
        manifest.validate().unwrap();
        use SharedNamespace::{Ipc, Net, Uts};
        for (list, ok) in [
            (vec![], true),
            (vec![Net, Ipc, Uts], true),
            (vec![Ipc, Net], false),
            (vec![Uts, Uts], false),
        ] {
            let mut m = manifest.clone();
            if let Some(criu) = m.criu.as_mut() {
                criu.shared_namespaces = list.clone();
            }
            assert_eq!(m.validate().is_ok(), ok, "{list:?}");
        }
        let names: Vec<_> = SharedNamespace::ALL.iter().map(|n| n.name()).collect();
        assert_eq!(names, ["net", "ipc", "uts"]);
    }

    #[test]
    fn sha256_hex_is_the_standard_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(crate::is_sha256_hex(&sha256_hex(b"")));
    }

    #[test]
    fn wrong_format_and_version_are_named_before_any_other_field() {
        let (manifest, _) = sample();
        let mut v = json(&manifest);
        v["format"] = "cuinterpose-state".into();
        // Also an unknown field: the format must be what is reported.
        v["extra"] = 1.into();
        assert_eq!(
            decode_value(&v),
            Err(ProtocolError::WrongFormat {
                expected: MANIFEST_FORMAT,
                found: "cuinterpose-state".into()
            })
        );
        v["format"] = 7.into();
        assert!(
            matches!(decode_value(&v), Err(ProtocolError::WrongFormat { found, .. }) if found == "7")
        );
        v.as_object_mut().unwrap().remove("format");
        assert!(
            matches!(decode_value(&v), Err(ProtocolError::WrongFormat { found, .. }) if found.is_empty())
        );

        let mut v = json(&manifest);
        v["version"] = (MANIFEST_VERSION + 1).into();
        v["new_field_of_the_next_version"] = true.into();
        assert_eq!(
            decode_value(&v),
            Err(ProtocolError::ManifestVersion {
                ours: MANIFEST_VERSION,
                theirs: MANIFEST_VERSION + 1
            })
        );
        let e = decode_value(&v).unwrap_err().to_string();
        assert!(e.contains("recreate the checkpoint"), "{e}");
        v["version"] = "1".into();
        assert!(matches!(decode_value(&v), Err(ProtocolError::Malformed(_))));
        v.as_object_mut().unwrap().remove("version");
        assert!(matches!(decode_value(&v), Err(ProtocolError::Malformed(_))));
    }

    #[test]
    fn refuses_non_json_oversized_unknown_missing_and_mistyped() {
        for input in [
            &b""[..],
            b"[]",
            b"null",
            b"{",
            b"\xff\xfe",
            b"{\"format\": \"cuinterpose-manifest\", \"version\": 1}",
        ] {
            assert!(decode(input).is_err(), "{input:?}");
        }
        let mut big = vec![b' '; MAX_MANIFEST_LEN + 1];
        big[0] = b'{';
        assert!(matches!(decode(&big), Err(ProtocolError::TooLarge { .. })));

        let (manifest, _) = sample();
        let mut v = json(&manifest);
        v["participants"][0]["uid"] = 0.into();
        assert!(
            matches!(decode_value(&v), Err(ProtocolError::Malformed(m)) if m.contains("unknown field"))
        );
        let mut v = json(&manifest);
        v["shim"].as_object_mut().unwrap().remove("sha256");
        assert!(
            matches!(decode_value(&v), Err(ProtocolError::Malformed(m)) if m.contains("missing field"))
        );
        let mut v = json(&manifest);
        v["participants"][1]["role"] = "observer".into();
        assert!(matches!(decode_value(&v), Err(ProtocolError::Malformed(_))));
        let mut v = json(&manifest);
        v["bytes"]["carriers"] = (-1).into();
        assert!(matches!(decode_value(&v), Err(ProtocolError::Malformed(_))));
        let mut text = String::from_utf8(encode(&manifest)).unwrap();
        text.push_str("{}");
        assert!(matches!(
            decode(text.as_bytes()),
            Err(ProtocolError::Malformed(_))
        ));
    }

    fn invalid(change: impl FnOnce(&mut Manifest)) -> String {
        let (mut manifest, _) = sample();
        change(&mut manifest);
        let Err(ProtocolError::Inconsistent(why)) = manifest.validate() else {
            panic!("accepted");
        };
        assert_eq!(
            decode(&encode(&manifest)),
            Err(ProtocolError::Inconsistent(why.clone()))
        );
        why
    }

    #[test]
    fn validate_refuses_each_inconsistency() {
        assert!(invalid(|m| m.tool_version.clear()).contains("tool version"));
        assert!(invalid(|m| m.participants.clear()).contains("no participants"));
        assert!(invalid(|m| m.participants[0].host_pid = 0).contains("pid 0"));
        assert!(invalid(|m| m.participants[0].ns_pid = 0).contains("pid 0"));
        assert!(invalid(|m| m.participants[1].host_pid = 1041).contains("host pid 1041"));
        assert!(invalid(|m| m.participants[1].ns_pid = 41).contains("namespace pid 41"));
        assert!(invalid(|m| m.participants[1].gpus[1].ordinal = 0).contains("ordinal 0"));
        assert!(invalid(|m| m.participants[0].gpus[0].uuid.clear()).contains("no uuid"));
        for socket in [
            "cuinterpose-41.sock".to_string(),
            "/tmp/../etc/passwd".into(),
            "/tmp/a\0b".into(),
            format!("/{}", "s".repeat(107)),
        ] {
            assert!(
                invalid(|m| m.participants[0].sockets = vec![socket.clone()]).contains("socket"),
                "{socket:?}"
            );
        }
        assert!(invalid(|m| m.shim.path = "libcuinterpose.so".into()).contains("absolute"));
        assert!(invalid(|m| m.shim.sha256 = "0F".repeat(32)).contains("shim sha-256"));
        assert!(invalid(|m| m.shim.sha256 = "0f".repeat(31)).contains("shim sha-256"));
        assert!(invalid(|m| m.driver_version = 0).contains("driver version"));
        assert!(invalid(|m| m.bytes.saved = m.bytes.carriers + 1).contains("bytes saved"));
        assert!(invalid(|m| m.criu.as_mut().unwrap().version.clear()).contains("criu"));
        assert!(invalid(|m| m.timings[1].phase = "freeze".into()).contains("timed twice"));
        assert!(invalid(|m| m.timings[0].phase.clear()).contains("phase name"));
        for file in ["", ".", "..", "../cuinterpose.state", "/etc/passwd", "a\0b"] {
            assert!(
                invalid(|m| m.state.file = file.into()).contains("plain file name"),
                "{file:?}"
            );
        }
        assert!(invalid(|m| m.state.sha256 = "x".repeat(64)).contains("state sha-256"));
    }

    #[test]
    fn verify_state_refuses_a_tampered_or_mismatched_state() {
        let (manifest, state_file) = sample();
        // Same length, one byte changed: the digest catches it before the checksum does.
        let mut tampered = state_file.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(matches!(
            manifest.verify_state(&tampered),
            Err(ProtocolError::DigestMismatch { .. })
        ));
        assert!(matches!(
            manifest.verify_state(&state_file[..state_file.len() - 1]),
            Err(ProtocolError::Inconsistent(m)) if m.contains("bytes")
        ));

        // A state that is valid on its own but disagrees with the manifest, re-recorded with its
        // own digest so that the cross-check is what refuses.
        let check = |change: &dyn Fn(&mut Manifest, &mut GroupState)| {
            let (mut manifest, _) = sample();
            let mut group = two_workers();
            change(&mut manifest, &mut group);
            let bytes = state::encode(&group);
            manifest.state.bytes = bytes.len() as u64;
            manifest.state.sha256 = sha256_hex(&bytes);
            match manifest.verify_state(&bytes) {
                Err(ProtocolError::Inconsistent(m)) => m,
                other => panic!("{other:?}"),
            }
        };
        assert!(check(&|m, _| m.participants[0].role = Role::Private).contains("role"));
        assert!(check(&|m, _| m.participants[1].host_pid = 7).contains("not in the state"));
        assert!(check(&|m, _| m.participants[1].ns_pid = 43).contains("namespace pid"));
        assert!(check(&|m, _| m.shim.sha256 = "1f".repeat(32)).contains("shim"));
        assert!(check(&|m, _| m.bytes.carriers += 1).contains("carriers"));
        assert!(
            check(&|m, _| {
                m.participants.pop();
            })
            .contains("participants")
        );
        let (mut manifest, _) = sample();
        let bad = b"CUISTATE garbage".to_vec();
        manifest.state.bytes = bad.len() as u64;
        manifest.state.sha256 = sha256_hex(&bad);
        assert!(manifest.verify_state(&bad).is_err());
    }

    #[test]
    fn roles_follow_the_record() {
        let group = two_workers();
        assert_eq!(Role::of(&group.participants[0].record), Role::Creator);
        assert_eq!(Role::of(&group.participants[1].record), Role::Importer);
        let mut both = group.participants[0].record.clone();
        both.imports = group.participants[1].record.imports.clone();
        assert_eq!(Role::of(&both), Role::CreatorAndImporter);
        let mut private = group.participants[0].record.clone();
        private.allocations.retain(|a| !a.shared);
        assert_eq!(Role::of(&private), Role::Private);
    }
}
