//! The wire format, pinned: the exact bytes this build writes for every message kind, every enum
//! variant, a state file, a ticket, a virtual IPC handle and a manifest, checked against golden
//! files in `tests/golden/`, and those files decoded back to the values they were made from.
//!
//! postcard writes struct fields in declaration order and an enum variant as its index in
//! declaration order, so reordering a field or a variant (of `Phase`, `ErrorCode`, `Blocker`, ...)
//! changes bytes without any compiler noticing; these tests are what notices. The samples give
//! every field of a struct a different value, so that swapping two fields of one type fails too.
//! A variant added at the end changes no existing bytes, so each enum's variants are also counted
//! (by decoding each index) and must all have a golden entry.
//!
//! A change here is a change of the format: bump the version it belongs to (`docs/design.md`,
//! "Versions") and replace the golden entries with the ones the failure prints.

use cuinterpose_protocol::ipc::IpcHandle;
use cuinterpose_protocol::manifest::{self, Manifest};
use cuinterpose_protocol::message::{
    self, CarrierMode, CopyStats, DataFile, Extent, FrameHeader, HEADER_LEN, PROTOCOL_VERSION,
    StreamStats,
};
use cuinterpose_protocol::state::{self, CarrierInfo, GroupState, ParticipantState, SuspendMode};
use cuinterpose_protocol::ticket::Ticket;
use cuinterpose_protocol::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    digits
        .chunks(2)
        .map(|pair| {
            let pair = std::str::from_utf8(pair).unwrap();
            u8::from_str_radix(pair, 16).unwrap_or_else(|_| panic!("not hex: {pair:?}"))
        })
        .collect()
}

/// A golden file as this build would write it: per entry a line `name:` and the bytes in hex, 32
/// to an indented line.
fn render(entries: &[(String, Vec<u8>)]) -> String {
    let mut out = String::new();
    for (name, bytes) in entries {
        out.push_str(name);
        out.push_str(":\n");
        for chunk in bytes.chunks(32) {
            out.push_str("    ");
            out.push_str(&hex(chunk));
            out.push('\n');
        }
    }
    out
}

/// Reads a golden file: `#` lines are comments, a line `name:` starts an entry, indented lines
/// hold its bytes in hex.
fn parse(text: &str) -> Vec<(String, Vec<u8>)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            let (_, digits) = entries
                .last_mut()
                .unwrap_or_else(|| panic!("hex before the first entry name: {line:?}"));
            digits.push_str(line.trim());
        } else {
            let name = line
                .strip_suffix(':')
                .unwrap_or_else(|| panic!("not an entry name: {line:?}"));
            entries.push((name.to_string(), String::new()));
        }
    }
    entries
        .into_iter()
        .map(|(name, digits)| (name, unhex(&digits)))
        .collect()
}

/// Compares what this build writes with `tests/golden/<file>`, entry by entry, names and order
/// included; on any difference prints the file as this build would write it.
fn check_golden(file: &str, actual: &[(String, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let path = format!("{GOLDEN}/{file}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let golden = parse(&text);
    let mut differences = Vec::new();
    let names = |entries: &[(String, Vec<u8>)]| -> Vec<String> {
        entries.iter().map(|(n, _)| n.clone()).collect()
    };
    if names(&golden) != names(actual) {
        differences.push(format!(
            "entries differ:\n  golden: {:?}\n  now:    {:?}",
            names(&golden),
            names(actual)
        ));
    }
    for (name, bytes) in actual {
        match golden.iter().find(|(n, _)| n == name) {
            Some((_, pinned)) if pinned == bytes => {}
            Some((_, pinned)) => differences.push(format!(
                "{name}:\n  golden: {}\n  now:    {}",
                hex(pinned),
                hex(bytes)
            )),
            None => differences.push(format!("{name}: no golden entry")),
        }
    }
    assert!(
        differences.is_empty(),
        "{path}: the encoding changed; bump the version of the format (docs/design.md, \
         \"Versions\") if that is meant, and replace the file with what this build writes.\n{}\n\
         --- this build writes ---\n{}",
        differences.join("\n"),
        render(actual)
    );
    golden
}

/// How many variants `T` has, found by decoding each variant index followed by zeros (a zero
/// decodes as every field type these enums hold: 0, false, "", an empty list, None, variant 0).
fn variant_count<T: DeserializeOwned>() -> usize {
    (0u8..128)
        .take_while(|&index| {
            let mut bytes = vec![index];
            bytes.extend_from_slice(&[0; 256]);
            postcard::take_from_bytes::<T>(&bytes).is_ok()
        })
        .count()
}

fn body<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_stdvec(value).unwrap()
}

fn id(byte: u8) -> AllocationId {
    AllocationId([byte; 16])
}

/// Every field a different value.
fn props() -> AllocationProps {
    AllocationProps {
        allocation_type: 1,
        requested_handle_types: 2,
        location_type: 3,
        location_id: 4,
        compression_type: 5,
        gpu_direct_rdma_capable: 6,
        usage: 7,
    }
}

fn phases() -> Vec<(&'static str, Phase)> {
    vec![
        ("running", Phase::Running),
        ("frozen", Phase::Frozen),
        ("saved", Phase::Saved),
        ("released", Phase::Released),
        ("loaded", Phase::Loaded),
        ("imported", Phase::Imported),
    ]
}

fn error_codes() -> Vec<(&'static str, ErrorCode)> {
    vec![
        ("wrong_phase", ErrorCode::WrongPhase),
        ("not_found", ErrorCode::NotFound),
        ("denied", ErrorCode::Denied),
        ("driver", ErrorCode::Driver),
        ("timeout", ErrorCode::Timeout),
        ("peer", ErrorCode::Peer),
        ("internal", ErrorCode::Internal),
        ("busy", ErrorCode::Busy),
        ("sticky", ErrorCode::Sticky),
    ]
}

fn carrier_modes() -> Vec<(&'static str, CarrierMode)> {
    vec![
        ("staged", CarrierMode::Staged),
        ("registered", CarrierMode::Registered),
        ("pinned", CarrierMode::Pinned),
    ]
}

fn suspend_modes() -> Vec<(&'static str, SuspendMode)> {
    vec![
        ("native", SuspendMode::Native),
        ("keep_contexts", SuspendMode::KeepContexts),
    ]
}

fn unowned_kinds() -> Vec<(&'static str, UnownedKind)> {
    vec![
        ("driver_alloc", UnownedKind::DriverAlloc),
        ("pitched", UnownedKind::Pitched),
        ("managed", UnownedKind::Managed),
        ("stream_ordered", UnownedKind::StreamOrdered),
    ]
}

fn backings() -> Vec<(&'static str, Backing)> {
    vec![
        ("created", Backing::Created(id(0xa1))),
        ("imported", Backing::Imported(id(0xa2))),
        ("foreign", Backing::Foreign { serial: 9 }),
        ("multicast", Backing::Multicast(id(0xa3))),
    ]
}

fn bind_targets() -> Vec<(&'static str, BindTarget)> {
    vec![
        (
            "memory",
            BindTarget::Memory {
                backing: Some(Backing::Created(id(0xa1))),
                offset: 2 << 20,
            },
        ),
        (
            "address",
            BindTarget::Address {
                address: 0x7000_0000_0000,
            },
        ),
    ]
}

fn blockers() -> Vec<(&'static str, Blocker)> {
    vec![
        (
            "foreign_import",
            Blocker::ForeignImport {
                serial: 1,
                size: 2 << 20,
            },
        ),
        (
            "unsupported_export",
            Blocker::UnsupportedExport {
                id: id(0xb1),
                handle_type: 8,
            },
        ),
        (
            "unsupported_import",
            Blocker::UnsupportedImport {
                handle_type: 4,
                size: 4096,
            },
        ),
        (
            "legacy_ipc_export",
            Blocker::LegacyIpcExport { address: 0x10 },
        ),
        (
            "legacy_ipc_import",
            Blocker::LegacyIpcImport { address: 0x20 },
        ),
        (
            "multicast_handle_type",
            Blocker::MulticastHandleType {
                id: id(0xb2),
                handle_types: 9,
            },
        ),
        (
            "multicast_foreign_memory",
            Blocker::MulticastForeignMemory {
                id: id(0xb3),
                device: 1,
                mc_offset: 4 << 20,
            },
        ),
        (
            "multicast_out_of_bounds",
            Blocker::MulticastOutOfBounds {
                id: id(0xb4),
                device: 2,
                mc_offset: 6 << 20,
                size: 8 << 20,
            },
        ),
        (
            "ungated_submission",
            Blocker::UngatedSubmission {
                entry: "cuLaunchKernel".into(),
                count: 3,
            },
        ),
    ]
}

/// A record with one of everything: every backing, every blocker, every binding target.
fn full_record() -> ProcessRecord {
    ProcessRecord {
        ns_pid: 41,
        phase: Phase::Frozen,
        allocations: vec![AllocationRecord {
            id: id(0xa1),
            size: 2 << 20,
            props: props(),
            shared: true,
            live_handles: 2,
        }],
        imports: vec![ImportRecord {
            id: id(0xa2),
            creator_ns_pid: 43,
            size: 4 << 20,
            props: props(),
            live_handles: 5,
        }],
        mappings: backings()
            .into_iter()
            .enumerate()
            .map(|(i, (_, backing))| MappingRecord {
                address: 0x7000_0000_0000 + ((i as u64) << 24),
                size: 2 << 20,
                offset: 0x1000,
                backing,
                access: vec![AccessRecord {
                    location_type: 1,
                    location_id: 2,
                    flags: 3,
                }],
            })
            .collect(),
        reservations: vec![ReservationRecord {
            address: 0x7000_0000_0000,
            size: 1 << 30,
            alignment: 1 << 21,
            flags: 4,
        }],
        blockers: blockers().into_iter().map(|(_, b)| b).collect(),
        calls_in_flight: 3,
        multicasts: vec![MulticastRecord {
            id: id(0xa3),
            creator_ns_pid: 41,
            size: 32 << 20,
            num_devices: 4,
            handle_types: 1,
            flags: 5,
            granularity: 2 << 20,
            shared: true,
            devices: vec![0, 3],
            bindings: bind_targets()
                .into_iter()
                .enumerate()
                .map(|(i, (_, target))| MulticastBinding {
                    device: i as i32,
                    mc_offset: (i as u64) << 22,
                    size: 2 << 20,
                    flags: 6,
                    target,
                })
                .collect(),
            live_handles: 7,
        }],
        unowned: unowned_kinds()
            .into_iter()
            .zip(1u64..)
            .map(|((_, kind), n)| UnownedRecord {
                kind,
                allocations: n,
                bytes: n << 20,
            })
            .collect(),
        gate: GateRecord {
            closed: true,
            waiting: 4,
            inside: 1,
        },
    }
}

fn copy_stats() -> CopyStats {
    CopyStats {
        mode: CarrierMode::Registered,
        bytes: 1 << 40,
        threads: 8,
        carrier_micros: 5,
        carrier_reused: true,
        pin_micros: 3,
        copy_micros: 11,
        staged_fallbacks: 1,
    }
}

/// One of each request kind.
fn requests() -> Vec<(&'static str, Request)> {
    vec![
        (
            "hello",
            Request::Hello {
                tool_version: "0.1.0".into(),
            },
        ),
        ("inspect", Request::Inspect),
        ("get_fd", Request::GetFd { id: id(0xc1) }),
        ("freeze", Request::Freeze { timeout_ms: 300 }),
        ("save", Request::Save),
        ("release", Request::Release),
        ("load", Request::Load),
        ("import", Request::Import),
        ("thaw", Request::Thaw),
        ("multicast", Request::Multicast(MulticastStep::AddDevices)),
        (
            "save_to",
            Request::SaveTo {
                store: true,
                workers: 8,
            },
        ),
        (
            "load_from",
            Request::LoadFrom {
                file: data_file(),
                workers: 8,
            },
        ),
        ("save_keeping_contexts", Request::SaveKeepingContexts),
        (
            "save_through_helper",
            Request::SaveThroughHelper {
                native_follows: true,
            },
        ),
        (
            "carrier_item",
            Request::CarrierItem {
                offset: 2 << 20,
                size: 4 << 20,
                device: [0xe1; 16],
            },
        ),
        (
            "carrier_copy",
            Request::CarrierCopy {
                to_host: true,
                total: 6 << 20,
            },
        ),
        ("carrier_forget", Request::CarrierForget),
        ("hold", Request::Hold),
        ("drain", Request::Drain { wait_ms: 250 }),
        ("admit", Request::Admit { count: 2 }),
        ("carrier_share", Request::CarrierShare),
        (
            "carrier_prepare",
            Request::CarrierPrepare {
                pid: 4242,
                bytes: 6 << 20,
            },
        ),
        ("pin_carrier", Request::PinCarrier),
    ]
}

fn multicast_steps() -> Vec<(&'static str, MulticastStep)> {
    vec![
        ("create", MulticastStep::Create),
        ("import", MulticastStep::Import),
        ("add_devices", MulticastStep::AddDevices),
        ("bind", MulticastStep::Bind),
    ]
}

/// A data file of two allocations, the second with a zero block.
fn data_file() -> DataFile {
    DataFile {
        length: 6 << 20,
        extents: vec![
            Extent {
                id: id(0xd1),
                offset: 0,
                size: 2 << 20,
                blake3: [0xb1; 32],
            },
            Extent {
                id: id(0xd2),
                offset: 2 << 20,
                size: (4 << 20) - 4096,
                blake3: [0xb2; 32],
            },
        ],
        zero_blocks: vec![2],
        blocks: Some(vec![[0xc1; 32], [0xc2; 32]]),
    }
}

/// One of each response kind (two of PhaseDone: with and without copy statistics).
fn responses() -> Vec<(&'static str, Response)> {
    vec![
        (
            "hello",
            Response::Hello(HelloReply {
                shim_version: "0.1.0".into(),
                ns_pid: 41,
                shim_sha256: "0f".repeat(32),
                driver_version: 12080,
                carrier_pinned_bytes: 256 << 20,
                carrier_helper: Some(message::HelperHold {
                    helper_pid: 77,
                    allocations: 3,
                    bytes: 6 << 20,
                    held_bytes: 8 << 20,
                }),
            }),
        ),
        ("records", Response::Records(full_record())),
        ("fd", Response::Fd { id: id(0xc2) }),
        (
            "phase_done",
            Response::PhaseDone {
                phase: Phase::Loaded,
                bytes: 1 << 30,
                micros: 12,
                stats: Some(copy_stats()),
            },
        ),
        (
            "phase_done_without_stats",
            Response::PhaseDone {
                phase: Phase::Released,
                bytes: 0,
                micros: 7,
                stats: None,
            },
        ),
        (
            "error",
            Response::Error {
                code: ErrorCode::Driver,
                message: "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY".into(),
            },
        ),
        (
            "streamed",
            Response::Streamed {
                phase: Phase::Saved,
                bytes: (6 << 20) - 4096,
                micros: 900,
                stats: StreamStats {
                    file_bytes: (4 << 20) - 4096,
                    zero_bytes: 2 << 20,
                    direct: true,
                    threads: 4,
                    micros: 850,
                    hash_micros: 1200,
                    shared_bytes: 2 << 20,
                    setup_micros: 130,
                    io_micros: 610,
                    wait_micros: 270,
                },
                file: data_file(),
            },
        ),
        ("accepted", Response::Accepted),
        (
            "copied",
            Response::Copied {
                stats: CopyStats {
                    mode: CarrierMode::Pinned,
                    bytes: 6 << 20,
                    threads: 8,
                    carrier_micros: 0,
                    carrier_reused: true,
                    pin_micros: 0,
                    copy_micros: 120,
                    staged_fallbacks: 0,
                },
            },
        ),
        (
            "drain",
            Response::Drain(message::DrainReport {
                drained: false,
                waiting: 2,
                admitted: 9,
                granted: 1,
                busy: vec!["device 0: work still running".into()],
                held_micros: 1500,
            }),
        ),
        (
            "carrier_fd",
            Response::CarrierFd {
                length: 8 << 20,
                helper_pid: 77,
            },
        ),
        (
            "prepared",
            Response::Prepared {
                pinned: 8 << 20,
                micros: 1200,
            },
        ),
    ]
}

/// Worker 41 creates and shares `a1` (and keeps `b1` private), worker 42 imports `a1`.
fn group() -> GroupState {
    let shared = id(0xa1);
    let creator = ProcessRecord {
        ns_pid: 41,
        phase: Phase::Saved,
        allocations: vec![
            AllocationRecord {
                id: shared,
                size: 2 << 20,
                props: props(),
                shared: true,
                live_handles: 1,
            },
            AllocationRecord {
                id: id(0xb1),
                size: 4096,
                props: props(),
                shared: false,
                live_handles: 2,
            },
        ],
        imports: vec![],
        mappings: vec![MappingRecord {
            address: 0x7000_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Created(shared),
            access: vec![AccessRecord {
                location_type: 1,
                location_id: 0,
                flags: 3,
            }],
        }],
        reservations: vec![ReservationRecord {
            address: 0x7000_0000_0000,
            size: 4 << 20,
            alignment: 1 << 21,
            flags: 0,
        }],
        blockers: vec![],
        calls_in_flight: 0,
        multicasts: vec![],
        unowned: vec![],
        gate: Default::default(),
    };
    let importer = ProcessRecord {
        ns_pid: 42,
        phase: Phase::Saved,
        allocations: vec![],
        imports: vec![ImportRecord {
            id: shared,
            creator_ns_pid: 41,
            size: 2 << 20,
            props: props(),
            live_handles: 3,
        }],
        mappings: vec![MappingRecord {
            address: 0x7100_0000_0000,
            size: 2 << 20,
            offset: 0,
            backing: Backing::Imported(shared),
            access: vec![],
        }],
        reservations: vec![],
        blockers: vec![],
        calls_in_flight: 0,
        multicasts: vec![],
        unowned: vec![],
        gate: Default::default(),
    };
    GroupState {
        created_unix_ms: 1_767_225_600_000,
        tool_version: "0.1.0".into(),
        // The mode that is not the default, so the golden file pins its position and tag.
        mode: SuspendMode::KeepContexts,
        participants: vec![
            ParticipantState {
                host_pid: 1041,
                ns_pid: 41,
                shim_sha256: "0f".repeat(32),
                record: creator,
                carriers: vec![
                    CarrierInfo {
                        id: shared,
                        bytes: 2 << 20,
                    },
                    CarrierInfo {
                        id: id(0xb1),
                        bytes: 4096,
                    },
                ],
            },
            ParticipantState {
                host_pid: 1042,
                ns_pid: 42,
                shim_sha256: "0f".repeat(32),
                record: importer,
                carriers: vec![],
            },
        ],
    }
}

fn sample_ticket() -> Ticket {
    Ticket {
        creator_ns_pid: 41,
        id: AllocationId(*b"0123456789abcdef"),
        size: 2 << 20,
        multicast: false,
    }
}

fn sample_ipc_handle() -> IpcHandle {
    IpcHandle {
        creator_ns_pid: 41,
        id: AllocationId(*b"0123456789abcdef"),
        offset: 0x1234,
        requested: 3 << 20,
        backing: 4 << 20,
    }
}

/// The manifest of [`group`] with `state_file` as its state file; every optional part present.
fn manifest_for(state_file: &[u8]) -> Manifest {
    let participant = |host_pid, ns_pid, role| manifest::ManifestParticipant {
        host_pid,
        ns_pid,
        command_line: vec!["worker".into(), format!("--rank={ns_pid}")],
        role,
        gpus: vec![
            manifest::GpuInfo {
                ordinal: 0,
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            },
            manifest::GpuInfo {
                ordinal: 1,
                uuid: "GPU-11111111-1111-1111-1111-111111111111".into(),
            },
        ],
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
            carriers: (2 << 20) + 4096,
        },
        criu: Some(manifest::CriuInfo {
            version: "4.2.1".into(),
            image_bytes: 1 << 30,
            link_remaps: vec![manifest::LinkRemap {
                link: "/dev/shm/link_remap.3".into(),
                kept_as: "/dev/shm/link_remap.3.cuinterpose-00112233445566ff".into(),
            }],
            tcp_established: true,
            shared_namespaces: vec![
                manifest::SharedNamespace::Net,
                manifest::SharedNamespace::Ipc,
            ],
            placement: manifest::CriuPlacement::ContainerInit {
                node_mounts: vec!["/etc/hosts".into(), "/dev/shm".into()],
            },
        }),
        timings: vec![
            manifest::PhaseTiming {
                phase: "freeze".into(),
                ms: 3,
            },
            manifest::PhaseTiming {
                phase: "save".into(),
                ms: 40,
            },
        ],
        state: manifest::StateFileRef {
            file: state::STATE_FILE_NAME.into(),
            bytes: state_file.len() as u64,
            sha256: manifest::sha256_hex(state_file),
        },
        data_files: vec![manifest::DataFileEntry::new(
            41,
            2 << 20,
            (2 << 20) - 4096,
            &data_file(),
        )],
    }
}

fn named<T>(
    prefix: &str,
    items: Vec<(&'static str, T)>,
    encode: impl Fn(&T) -> Vec<u8>,
) -> Vec<(String, Vec<u8>)> {
    items
        .iter()
        .map(|(name, value)| (format!("{prefix}.{name}"), encode(value)))
        .collect()
}

/// Golden entries of `items` and a check that they cover every variant of `T` and decode back.
fn variant_entries<T>(prefix: &str, items: Vec<(&'static str, T)>) -> Vec<(String, Vec<u8>)>
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    assert_eq!(
        items.len(),
        variant_count::<T>(),
        "{prefix}: every variant needs a golden entry"
    );
    named(prefix, items, body)
}

#[test]
fn every_enum_variant_encodes_as_pinned() {
    let mut entries = variant_entries("phase", phases());
    entries.extend(variant_entries("error_code", error_codes()));
    entries.extend(variant_entries("carrier_mode", carrier_modes()));
    entries.extend(variant_entries("backing", backings()));
    entries.extend(variant_entries("blocker", blockers()));
    entries.extend(variant_entries("suspend_mode", suspend_modes()));
    entries.extend(variant_entries("bind_target", bind_targets()));
    entries.extend(variant_entries("multicast_step", multicast_steps()));
    entries.extend(variant_entries("unowned_kind", unowned_kinds()));
    let golden = check_golden("variants.hex", &entries);

    // And the pinned bytes decode to the values they were made from.
    let decoded = |name: &str| -> &[u8] { &golden.iter().find(|(n, _)| n == name).unwrap().1 };
    fn back<T: DeserializeOwned + PartialEq + std::fmt::Debug>(bytes: &[u8], value: &T) {
        assert_eq!(&postcard::from_bytes::<T>(bytes).unwrap(), value);
    }
    for (name, v) in phases() {
        back(decoded(&format!("phase.{name}")), &v);
    }
    for (name, v) in error_codes() {
        back(decoded(&format!("error_code.{name}")), &v);
    }
    for (name, v) in carrier_modes() {
        back(decoded(&format!("carrier_mode.{name}")), &v);
    }
    for (name, v) in backings() {
        back(decoded(&format!("backing.{name}")), &v);
    }
    for (name, v) in blockers() {
        back(decoded(&format!("blocker.{name}")), &v);
    }
    for (name, v) in suspend_modes() {
        back(decoded(&format!("suspend_mode.{name}")), &v);
    }
    for (name, v) in bind_targets() {
        back(decoded(&format!("bind_target.{name}")), &v);
    }
    for (name, v) in multicast_steps() {
        back(decoded(&format!("multicast_step.{name}")), &v);
    }
    for (name, v) in unowned_kinds() {
        back(decoded(&format!("unowned_kind.{name}")), &v);
    }
}

#[test]
fn every_message_kind_frames_as_pinned() {
    assert_eq!(requests().len(), variant_count::<Request>());
    // Two PhaseDone entries, one of every other kind.
    assert_eq!(responses().len(), variant_count::<Response>() + 1);
    let mut entries = named("request", requests(), message::encode_request);
    entries.extend(named("response", responses(), message::encode_response));
    let golden = check_golden("frames.hex", &entries);

    for ((name, frame), (_, request)) in golden.iter().zip(requests()) {
        let (header, body) = frame.split_at(HEADER_LEN);
        let header = FrameHeader::decode(header.try_into().unwrap()).unwrap();
        assert_eq!(header.version, PROTOCOL_VERSION, "{name}");
        assert_eq!(header.kind, request.kind(), "{name}");
        assert_eq!(
            message::decode_request(&header, body).unwrap(),
            request,
            "{name}"
        );
    }
    for ((name, frame), (_, response)) in golden[requests().len()..].iter().zip(responses()) {
        let (header, body) = frame.split_at(HEADER_LEN);
        let header = FrameHeader::decode(header.try_into().unwrap()).unwrap();
        assert_eq!(header.kind, response.kind(), "{name}");
        assert_eq!(
            message::decode_response(&header, body).unwrap(),
            response,
            "{name}"
        );
    }
}

#[test]
fn the_state_file_the_ticket_and_the_ipc_handle_are_as_pinned() {
    let state_file = state::encode(&group());
    let ticket = sample_ticket().encode().to_vec();
    let ipc_handle = sample_ipc_handle().encode().to_vec();
    let golden = check_golden(
        "files.hex",
        &[
            ("state_file".to_string(), state_file),
            ("ticket".to_string(), ticket),
            ("ipc_handle".to_string(), ipc_handle),
        ],
    );
    assert_eq!(state::decode(&golden[0].1).unwrap(), group());
    assert_eq!(Ticket::decode(&golden[1].1).unwrap(), sample_ticket());
    assert_eq!(
        IpcHandle::decode(&golden[2].1).unwrap(),
        sample_ipc_handle()
    );
}

#[test]
fn the_manifest_is_as_pinned() {
    let state_file = state::encode(&group());
    let manifest = manifest_for(&state_file);
    manifest.validate().unwrap();
    let written = manifest::encode(&manifest);
    let path = format!("{GOLDEN}/manifest.json");
    let golden = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        written == golden,
        "{path}: the manifest's JSON changed; bump MANIFEST_VERSION (docs/design.md, \"Versions\") \
         if that is meant, and replace the file with what this build writes:\n{}",
        String::from_utf8_lossy(&written)
    );
    let decoded = manifest::decode(&golden).unwrap();
    assert_eq!(decoded, manifest);
    assert_eq!(decoded.verify_state(&state_file).unwrap(), group());
}
