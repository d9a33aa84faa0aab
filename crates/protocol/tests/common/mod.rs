//! Valid sample values of every format, shared by the totality test and the fuzz-seed example.

use cuinterpose_protocol::manifest::{self, Manifest};
use cuinterpose_protocol::state::{self, CarrierInfo, GroupState, ParticipantState};
use cuinterpose_protocol::*;

/// Every request.
pub fn requests() -> Vec<Request> {
    vec![
        Request::Hello {
            tool_version: "0.1.0".into(),
        },
        Request::Inspect,
        Request::GetFd {
            id: AllocationId([3; 16]),
        },
        Request::Freeze { timeout_ms: 300 },
        Request::Save,
        Request::Release,
        Request::Load,
        Request::Import,
        Request::Thaw,
    ]
}

fn props() -> AllocationProps {
    AllocationProps {
        allocation_type: 1,
        requested_handle_types: 1,
        location_type: 1,
        location_id: 0,
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        usage: 0,
    }
}

fn records(
    ns_pid: u32,
    creator_of: Option<AllocationId>,
    importer_of: Option<(AllocationId, u32)>,
) -> ProcessRecord {
    let mut record = ProcessRecord {
        ns_pid,
        phase: Phase::Saved,
        allocations: vec![],
        imports: vec![],
        mappings: vec![],
        reservations: vec![ReservationRecord {
            address: 0x7000_0000_0000,
            size: 1 << 30,
            alignment: 0,
            flags: 0,
        }],
        blockers: vec![Blocker::LegacyIpcImport { address: 0x10 }],
        calls_in_flight: 0,
        multicasts: vec![],
        unowned: vec![],
        gate: Default::default(),
    };
    if let Some(id) = creator_of {
        record.allocations.push(AllocationRecord {
            id,
            size: 2 << 20,
            props: props(),
            shared: true,
            live_handles: 1,
        });
        record.mappings.push(MappingRecord {
            address: 0x7000_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Created(id),
            access: vec![AccessRecord {
                location_type: 1,
                location_id: 0,
                flags: 3,
            }],
        });
    }
    if let Some((id, creator)) = importer_of {
        record.imports.push(ImportRecord {
            id,
            creator_ns_pid: creator,
            size: 2 << 20,
            props: props(),
            live_handles: 2,
        });
        record.mappings.push(MappingRecord {
            address: 0x7100_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Imported(id),
            access: vec![],
        });
    }
    record
}

/// Every response, one of each kind.
pub fn responses() -> Vec<Response> {
    vec![
        Response::Hello(HelloReply {
            shim_version: "0.1.0".into(),
            ns_pid: 41,
            shim_sha256: "0f".repeat(32),
            driver_version: 12080,
            carrier_pinned_bytes: 256 << 20,
            carrier_helper: None,
        }),
        Response::Records(records(
            41,
            Some(AllocationId([0xaa; 16])),
            Some((AllocationId([0xcc; 16]), 43)),
        )),
        Response::Fd {
            id: AllocationId([1; 16]),
        },
        Response::PhaseDone {
            phase: Phase::Released,
            bytes: 1 << 40,
            micros: 12,
            stats: Some(message::CopyStats {
                mode: message::CarrierMode::Registered,
                bytes: 1 << 40,
                threads: 8,
                carrier_micros: 5,
                carrier_reused: true,
                pin_micros: 3,
                copy_micros: 11,
                staged_fallbacks: 1,
            }),
        },
        Response::Error {
            code: ErrorCode::Driver,
            message: "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY".into(),
        },
    ]
}

/// Two workers: 41 creates and shares an allocation, 42 imports it.
pub fn group() -> GroupState {
    let id = AllocationId([0xaa; 16]);
    GroupState {
        created_unix_ms: 1_767_225_600_000,
        tool_version: "0.1.0".into(),
        mode: Default::default(),
        participants: vec![
            ParticipantState {
                host_pid: 1041,
                ns_pid: 41,
                shim_sha256: "0f".repeat(32),
                record: records(41, Some(id), None),
                carriers: vec![CarrierInfo { id, bytes: 2 << 20 }],
            },
            ParticipantState {
                host_pid: 1042,
                ns_pid: 42,
                shim_sha256: "0f".repeat(32),
                record: records(42, None, Some((id, 41))),
                carriers: vec![],
            },
        ],
    }
}

/// A manifest describing [`group`] with `state_file` as its state file.
pub fn manifest_for(state_file: &[u8]) -> Manifest {
    let participant = |host_pid, ns_pid, role| manifest::ManifestParticipant {
        host_pid,
        ns_pid,
        command_line: vec!["worker".into(), format!("--rank={ns_pid}")],
        role,
        gpus: vec![manifest::GpuInfo {
            ordinal: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
        }],
        sockets: vec![format!("/tmp/cuinterpose-{ns_pid}.sock")],
    };
    Manifest {
        format: manifest::MANIFEST_FORMAT.into(),
        version: manifest::MANIFEST_VERSION,
        created_unix_ms: 1_767_225_600_000,
        tool_version: "0.1.0".into(),
        participants: vec![
            participant(1041, 41, manifest::Role::Creator),
            participant(1042, 42, manifest::Role::Importer),
        ],
        shim: manifest::ShimIdentity {
            path: "/opt/cuinterpose/libcuinterpose.so".into(),
            sha256: "0f".repeat(32),
        },
        driver_version: 12080,
        bytes: manifest::ByteCounts {
            saved: 2 << 20,
            carriers: 2 << 20,
        },
        criu: Some(manifest::CriuInfo {
            version: "4.2.1".into(),
            image_bytes: 1 << 30,
            link_remaps: vec![manifest::LinkRemap {
                link: "/dev/shm/link_remap.3".into(),
                kept_as: "/dev/shm/link_remap.3.cuinterpose-00112233445566ff".into(),
            }],
            tcp_established: false,
            shared_namespaces: Vec::new(),
            placement: manifest::CriuPlacement::Host,
        }),
        timings: vec![manifest::PhaseTiming {
            phase: "save".into(),
            ms: 4,
        }],
        state: manifest::StateFileRef {
            file: state::STATE_FILE_NAME.into(),
            bytes: state_file.len() as u64,
            sha256: manifest::sha256_hex(state_file),
        },
        data_files: vec![manifest::DataFileEntry {
            file: manifest::data_file_name(41),
            ns_pid: 41,
            bytes: 2 << 20,
            written_bytes: 2 << 20,
            shared_bytes: 0,
            extents: vec![manifest::DataExtent {
                id: "a1".repeat(16),
                offset: 0,
                size: 2 << 20,
                blake3: "b3".repeat(32),
            }],
            zero_blocks: vec![],
            blocks: Some(vec!["c4".repeat(32)]),
        }],
    }
}
