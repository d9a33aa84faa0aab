//! Which carrier a suspend uses: `--carrier auto` (the default) picks the fastest one the machine
//! allows, `--carrier helper` / `--carrier process` ask for one, and a helper the machine cannot
//! hold is refused before anything of the group changes.
//!
//! The carrier helper is the fastest for plain cycles (docs/design.md, "Where the pinned carrier
//! lives": the application holds no pinned memory at its native checkpoint, the helper's copies
//! run at the link's rate), but it has three costs the machine must allow:
//! - its context stays on every GPU while the application runs again, so each device must have
//!   room for it beside what the group holds now ([`ToolConfig::helper_context_bytes`]);
//! - it pins a carrier as large as the group's bytes, which `RLIMIT_MEMLOCK` must allow (the
//!   helper inherits the tool's limit and capabilities: with `CAP_IPC_LOCK`, as root has it, the
//!   kernel applies no limit);
//! - pinned pages cannot be reclaimed, so they may take at most half of the host's available
//!   memory (a process carrier is pageable and can be swapped or reclaimed under pressure).
//!
//! A keep-contexts cycle has no native restore that re-pins an in-process carrier, so there the
//! shim's own pinned carrier moves as fast as the helper (measured: 48.0 / 41.8 GB/s against 47.6 /
//! 40.6) and no helper context takes GPU memory: `auto` keeps each process's own carrier.
//!
//! [`ToolConfig::helper_context_bytes`]: crate::config::ToolConfig::helper_context_bytes

use protocol::state::SuspendMode;
use serde::Serialize;

/// Where a cycle's bytes wait between Save and Load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Carrier {
    /// The carrier helper of the shims' control directory.
    Helper,
    /// Each process's own carrier (the shim's `CUINTERPOSE_CARRIER` mode: staged for plain cycles,
    /// pinned for keep-contexts ones).
    Process,
    /// No carrier: a checkpoint streams device memory straight into its data files.
    None,
}

/// What `--carrier` asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Requested {
    Auto,
    Process,
    Helper,
}

/// What the machine allows, read before anything of the group changes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Machine {
    /// The tool's soft `RLIMIT_MEMLOCK` in bytes, which a helper it starts inherits; `None`:
    /// unlimited, or the tool has `CAP_IPC_LOCK` (which the helper inherits too), to which the
    /// kernel applies no limit.
    pub memlock: Option<u64>,
    /// `MemAvailable` of `/proc/meminfo`.
    pub host_available: u64,
    /// Free memory of each device the tool sees; empty when not read (a helper already runs, its
    /// context is already there; or the cycle keeps contexts and no helper was asked for).
    pub devices: Vec<DeviceRoom>,
    /// A helper already answers in every control directory of the group.
    pub helper_running: bool,
    /// The choice is `cuinterpose prepare`'s, which starts the helper and pins its carriers
    /// before any suspend: the choice of a prepared group.
    pub preparing: bool,
}

/// One device's memory as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceRoom {
    pub ordinal: u32,
    pub free: u64,
    pub total: u64,
}

/// The carrier of a cycle, why, and what it costs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct CarrierChoice {
    pub carrier: Carrier,
    pub requested: Requested,
    /// One sentence: why this carrier.
    pub reason: String,
    /// Host memory the carriers hold pinned between cycles: after a suspend, what the shims and
    /// the helper report holding; before one, what the chosen carrier will pin.
    pub pinned_host_bytes: u64,
    /// GPU memory the helper's context holds on each device it copies on while the group runs
    /// (the `CUINTERPOSE_HELPER_CONTEXT_MIB` room: 527 MiB measured on the H200); 0 without one.
    pub helper_gpu_bytes: u64,
    /// The facts the choice was made from.
    pub machine: Machine,
    /// What the Save spent on its carriers (a suspend's report; `None` before one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub save: Option<SaveCarriers>,
}

/// The carriers' share of a Save, from the shims' copy statistics: where carriers were prepared
/// ahead (`cuinterpose prepare`) or kept from an earlier cycle, the Save pins nothing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SaveCarriers {
    /// The slowest shim's carrier making, first touch and pinning before its copy.
    pub carrier_millis: f64,
    /// The slowest shim's copies themselves (the rest of its Save maps, cuts and answers).
    pub copy_millis: f64,
    /// Every carrier that moved bytes existed, big enough (and pinned, for a pinned one), before
    /// the Save.
    pub carriers_reused: bool,
}

const MIB: u64 = 1 << 20;

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / MIB as f64)
}

/// Why no device has room for the helper's context, or `None` when every one has: a helper
/// without that room could take memory the application needs to recreate its allocations at Load.
fn no_room(machine: &Machine, context_bytes: u64) -> Option<String> {
    if machine.helper_running {
        return None;
    }
    let d = machine.devices.iter().find(|d| d.free < context_bytes)?;
    Some(format!(
        "device {} has {} free of {}, and the helper's context needs {} beside what the group \
         holds (CUINTERPOSE_HELPER_CONTEXT_MIB)",
        d.ordinal,
        mib(d.free),
        mib(d.total),
        mib(context_bytes)
    ))
}

/// Why the helper could not pin `need` bytes, or `None` when it can. The helper still works
/// without it (a registration the driver refuses makes it copy staged), only slower.
pub fn no_pinning(machine: &Machine, need: u64) -> Option<String> {
    if let Some(limit) = machine.memlock
        && limit < need
    {
        return Some(format!(
            "RLIMIT_MEMLOCK is {} and the helper would pin {} (ulimit -l unlimited allows it)",
            mib(limit),
            mib(need)
        ));
    }
    if need > machine.host_available / 2 {
        return Some(format!(
            "the helper would pin {} and the host has {} available: pinned pages cannot be \
             reclaimed, so they may take at most half",
            mib(need),
            mib(machine.host_available)
        ));
    }
    None
}

/// The carrier for a cycle in `mode` moving `need` bytes (the group's allocations the shims
/// created), or why the carrier asked for cannot be used.
pub fn choose(
    requested: Requested,
    mode: SuspendMode,
    need: u64,
    machine: Machine,
    context_bytes: u64,
) -> Result<CarrierChoice, String> {
    let helper = |reason: String| CarrierChoice {
        carrier: Carrier::Helper,
        requested,
        reason,
        pinned_host_bytes: need,
        helper_gpu_bytes: context_bytes,
        machine: machine.clone(),
        save: None,
    };
    let process = |reason: String| {
        // A keep-contexts cycle pins the process's own carrier (the shim's `auto` mode) where
        // RLIMIT_MEMLOCK lets it; a plain cycle stages through small buffers.
        let pins = mode == SuspendMode::KeepContexts && machine.memlock.is_none_or(|l| l >= need);
        CarrierChoice {
            carrier: Carrier::Process,
            requested,
            reason,
            pinned_host_bytes: if pins { need } else { 0 },
            helper_gpu_bytes: 0,
            machine: machine.clone(),
            save: None,
        }
    };
    let refusal = no_room(&machine, context_bytes);
    let unpinned = no_pinning(&machine, need);
    if requested == Requested::Helper
        && let Some(why) = refusal.clone()
    {
        return Err(why);
    }
    match (requested, refusal.or(unpinned.clone())) {
        (Requested::Process, _) => Ok(process("asked for (--carrier process)".into())),
        (Requested::Helper, _) => Ok(match unpinned {
            None => helper("asked for (--carrier helper)".into()),
            Some(why) => CarrierChoice {
                pinned_host_bytes: 0,
                ..helper(format!(
                    "asked for (--carrier helper), but {why}: where the driver refuses its \
                     registrations the helper copies staged"
                ))
            },
        }),
        (Requested::Auto, _) if mode == SuspendMode::KeepContexts => Ok(process(
            "a keep-contexts cycle: each process's own pinned carrier is as fast as the helper \
             there (no native restore re-pins it), and no helper context takes GPU memory"
                .into(),
        )),
        (Requested::Auto, None) if machine.helper_running => Ok(helper(
            "the fastest: the carrier helper already runs, its context and pinned carriers kept"
                .into(),
        )),
        (Requested::Auto, None) if machine.preparing => Ok(helper(format!(
            "the fastest, and the machine allows it: room for its context on every device, {} \
             to pin within RLIMIT_MEMLOCK and half the available host memory",
            mib(need)
        ))),
        // An unprepared helper pins its carrier inside the first suspend: measured on the H100
        // (docs/measurements.md, 2026-12-07), 2.68x native for that cycle against 5.72x for
        // each process's own staged carrier; from the second cycle on, 7.56x against 6.52x.
        (Requested::Auto, None) => Ok(process(format!(
            "each process's own carrier (staged, little pinned memory): the carrier helper is not \
             prepared, and its first cycle would pin {} inside the suspend; `cuinterpose prepare` \
             starts it and pins ahead where the machine allows it, and auto then takes it",
            mib(need)
        ))),
        (Requested::Auto, Some(why)) => Ok(process(format!(
            "each process's own carrier (staged, little pinned memory): the helper does not fit: \
             {why}"
        ))),
    }
}

/// The choice of a checkpoint to disk: no carrier.
pub fn none_for_disk(machine: Machine) -> CarrierChoice {
    CarrierChoice {
        carrier: Carrier::None,
        requested: Requested::Auto,
        reason: "a checkpoint streams device memory straight into its data files (no carrier)"
            .into(),
        pinned_host_bytes: 0,
        helper_gpu_bytes: 0,
        machine,
        save: None,
    }
}

/// The tool's `RLIMIT_MEMLOCK` (soft, none with `CAP_IPC_LOCK`) and the host's available memory;
/// no devices.
pub fn host_facts() -> Machine {
    let memlock = if may_lock_unlimited() {
        None
    } else {
        rustix::process::getrlimit(rustix::process::Resource::Memlock).current
    };
    Machine {
        memlock,
        host_available: crate::procfs::meminfo("MemAvailable:").unwrap_or(0),
        devices: Vec::new(),
        helper_running: false,
        preparing: false,
    }
}

/// Whether this process has `CAP_IPC_LOCK` in its effective set: the kernel then applies no
/// `RLIMIT_MEMLOCK` to what it pins (root's case, where the default limit is only 8 MiB).
fn may_lock_unlimited() -> bool {
    rustix::thread::capabilities(None).is_ok_and(|caps| {
        caps.effective
            .contains(rustix::thread::CapabilitySet::IPC_LOCK)
    })
}

/// Free memory of every device `driver` sees.
pub fn device_rooms(
    driver: &crate::native::Driver,
) -> Result<Vec<DeviceRoom>, crate::ControlError> {
    (0..driver.device_count()?)
        .map(|ordinal| {
            let (free, total) = driver.memory_info(ordinal)?;
            Ok(DeviceRoom {
                ordinal,
                free,
                total,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const CONTEXT: u64 = 560 * MIB;

    fn roomy() -> Machine {
        Machine {
            memlock: None,
            host_available: 64 * GIB,
            devices: vec![DeviceRoom {
                ordinal: 0,
                free: 40 * GIB,
                total: 80 * GIB,
            }],
            helper_running: false,
            preparing: false,
        }
    }

    fn auto(machine: Machine, mode: SuspendMode) -> CarrierChoice {
        choose(Requested::Auto, mode, 8 * GIB, machine, CONTEXT).unwrap()
    }

    #[test]
    fn auto_takes_the_helper_once_prepared_where_the_machine_allows_it() {
        // Not prepared: its first cycle would pin inside the suspend.
        let c = auto(roomy(), SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Process);
        assert!(c.reason.contains("not prepared"), "{}", c.reason);
        assert_eq!((c.pinned_host_bytes, c.helper_gpu_bytes), (0, 0));
        // What prepare chooses, and every cycle after it.
        let mut preparing = roomy();
        preparing.preparing = true;
        let c = auto(preparing, SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Helper);
        assert_eq!(
            (c.pinned_host_bytes, c.helper_gpu_bytes),
            (8 * GIB, CONTEXT)
        );
        let mut running = roomy();
        running.helper_running = true;
        let c = auto(running, SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Helper);
        assert_eq!(
            (c.pinned_host_bytes, c.helper_gpu_bytes),
            (8 * GIB, CONTEXT)
        );
    }

    #[test]
    fn auto_falls_back_to_process_carriers_naming_what_is_missing() {
        let mut small_memlock = roomy();
        small_memlock.memlock = Some(64 << 10);
        let c = auto(small_memlock, SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Process);
        assert!(c.reason.contains("RLIMIT_MEMLOCK"), "{}", c.reason);
        assert_eq!((c.pinned_host_bytes, c.helper_gpu_bytes), (0, 0));

        let mut full_gpu = roomy();
        full_gpu.devices[0].free = 100 * MIB;
        let c = auto(full_gpu.clone(), SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Process);
        assert!(
            c.reason.contains("device 0 has 100 MiB free"),
            "{}",
            c.reason
        );
        // A helper that already runs holds its context already.
        full_gpu.helper_running = true;
        assert_eq!(auto(full_gpu, SuspendMode::Native).carrier, Carrier::Helper);

        let mut little_host = roomy();
        little_host.host_available = 12 * GIB;
        let c = auto(little_host, SuspendMode::Native);
        assert_eq!(c.carrier, Carrier::Process);
        assert!(c.reason.contains("at most half"), "{}", c.reason);
    }

    #[test]
    fn keep_contexts_cycles_keep_their_own_pinned_carriers() {
        let c = auto(roomy(), SuspendMode::KeepContexts);
        assert_eq!(c.carrier, Carrier::Process);
        assert_eq!(c.pinned_host_bytes, 8 * GIB);
        let mut small_memlock = roomy();
        small_memlock.memlock = Some(MIB);
        assert_eq!(
            auto(small_memlock, SuspendMode::KeepContexts).pinned_host_bytes,
            0
        );
    }

    #[test]
    fn an_explicit_helper_the_machine_cannot_hold_is_refused_an_explicit_process_never() {
        let mut full_gpu = roomy();
        full_gpu.devices[0].free = MIB;
        let why = choose(
            Requested::Helper,
            SuspendMode::Native,
            GIB,
            full_gpu.clone(),
            CONTEXT,
        )
        .unwrap_err();
        assert!(why.contains("device 0"), "{why}");
        let c = choose(
            Requested::Process,
            SuspendMode::Native,
            GIB,
            full_gpu,
            CONTEXT,
        )
        .unwrap();
        assert_eq!(c.carrier, Carrier::Process);
        assert!(c.reason.contains("--carrier process"));
        // Without the pinning the helper still runs (staged): asked for, it is used, and said so.
        let mut small_memlock = roomy();
        small_memlock.memlock = Some(MIB);
        let c = choose(
            Requested::Helper,
            SuspendMode::Native,
            GIB,
            small_memlock,
            CONTEXT,
        )
        .unwrap();
        assert_eq!((c.carrier, c.pinned_host_bytes), (Carrier::Helper, 0));
        assert!(c.reason.contains("RLIMIT_MEMLOCK"), "{}", c.reason);
    }
}
