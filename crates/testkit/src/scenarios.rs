//! The scenario list: the same programs of workloads run on whatever `libcuda.so.1` is chosen (the
//! fake driver in CI, the real one on the GPU machine), with or without the shim, each returning
//! an outcome string that the GPU lane puts beside the fake's.
//!
//! Outcome strings:
//! - `ok`: every step did what it should;
//! - otherwise the steps that did not, in order, as `step=result`, where `result` is a driver
//!   result name (`restore=CUDA_ERROR_NOT_SUPPORTED unlock=CUDA_ERROR_ILLEGAL_STATE`), a workload
//!   error kind (`b:verify-a0-32=mismatch`: process `b`, region `a0`, pattern seed 32), or
//!   `hang>20s` for a native call still running at the limit (nothing after a hang is attempted);
//! - `crash` for a `vmm-errors` probe that killed its process (a signal), `exit:N` if it exited;
//! - `skipped: WHY` when the machine cannot run the scenario (`device-remap` on one GPU);
//! - `error: ...` when the scenario could not be set up at all.
//!
//! Native steps are `lock`, `checkpoint`, `restore`, `unlock` on the process named by the prefix
//! (`b:restore`); a scenario that checkpoints one process leaves the prefix out. After a failed
//! checkpoint or restore the process is still unlocked (as a tool would), and the unlock is part
//! of the outcome.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;

use cuda_abi::CUuuid;

use crate::driver::Resolve;
use crate::grammar;
use crate::harness::{
    Artifacts, DriverKind, Group, HarnessError, LaunchError, TestEnv, Workload, WorkloadOptions,
};
use crate::native::{self, Bounded, Driver, bounded};
use crate::probes::{self, Ended, PROBES, last_running};
use crate::reply::Reply;

/// How scenarios run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the workload (and shim, and fake driver) are.
    pub artifacts: Artifacts,
    /// Which driver.
    pub driver: DriverKind,
    /// Preload the shim into every workload.
    pub shim: bool,
    /// Bytes per allocation (rounded up to the granularity).
    pub size: u64,
    /// How long a native call may run before it counts as a hang.
    pub hang_limit: Duration,
    /// The `timeoutMs` of every native lock.
    pub lock_timeout_ms: u32,
}

impl Settings {
    /// The fake driver of this build, no shim, 4 MiB allocations, 20 s hang limit, 10 s locks.
    pub fn fake() -> Result<Settings, HarnessError> {
        Ok(Settings {
            artifacts: Artifacts::locate()?,
            driver: DriverKind::Fake,
            shim: false,
            size: 4 << 20,
            hang_limit: Duration::from_secs(20),
            lock_timeout_ms: 10_000,
        })
    }
}

/// One scenario.
#[derive(Debug)]
pub struct Scenario {
    /// Stable name (tests and the GPU lane refer to it).
    pub name: &'static str,
    /// What it shows.
    pub about: &'static str,
    /// What r580 did in `docs/measurements.md` (`?` where a step was not measured; empty when the
    /// scenario was not measured there).
    pub r580: &'static str,
    /// May hang on a real driver: runs last, skipped by `--skip-hangs`.
    pub hangs: bool,
    run: fn(&Ctx) -> Result<Vec<Case>, HarnessError>,
}

/// One result of a scenario (most have one; `vmm-errors` has one per probe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    /// The sub-case, if the scenario has several.
    pub case: Option<String>,
    /// The outcome string.
    pub outcome: String,
}

fn single(outcome: String) -> Vec<Case> {
    vec![Case {
        case: None,
        outcome,
    }]
}

/// A result row.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The scenario.
    pub scenario: &'static str,
    /// The sub-case.
    pub case: Option<String>,
    /// The outcome string.
    pub outcome: String,
    /// The scenario's r580 expectation.
    pub r580: &'static str,
    /// Wall time of the whole scenario.
    pub seconds: f64,
}

impl Outcome {
    /// `scenario` or `scenario/case`.
    pub fn label(&self) -> String {
        match &self.case {
            Some(c) => format!("{}/{c}", self.scenario),
            None => self.scenario.to_owned(),
        }
    }

    /// One JSON object.
    pub fn to_json(&self, settings: &Settings) -> serde_json::Value {
        json!({
            "scenario": self.scenario,
            "case": self.case,
            "label": self.label(),
            "outcome": self.outcome,
            "r580": self.r580,
            "seconds": self.seconds,
            "driver": settings.driver.as_str(),
            "shim": settings.shim,
        })
    }
}

/// What a scenario function gets: a private [`TestEnv`] and the settings.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The scenario's environment.
    pub env: TestEnv,
    /// The settings.
    pub settings: &'a Settings,
    native: OnceLock<Arc<Driver>>,
}

impl Ctx<'_> {
    fn native(&self) -> Result<Ops, HarnessError> {
        let native = match self.native.get() {
            Some(n) => Arc::clone(n),
            None => {
                let n = self.env.native()?;
                Arc::clone(self.native.get_or_init(|| n))
            }
        };
        Ok(Ops {
            native,
            limit: self.settings.hang_limit,
            lock_ms: self.settings.lock_timeout_ms,
        })
    }

    fn spawn(&self, name: &str) -> Result<Workload, LaunchError> {
        self.env.spawn(WorkloadOptions::new(name))
    }

    /// The allocation size: the setting rounded up to `w`'s granularity.
    fn size(&self, w: &Workload) -> Result<u64, HarnessError> {
        let reply = w.ok("granularity")?;
        let g = reply.u64("granularity").unwrap_or(1).max(1);
        Ok(self.settings.size.max(1).div_ceil(g) * g)
    }
}

/// Steps taken and what each gave.
#[derive(Debug, Default)]
struct Steps {
    list: Vec<(String, String)>,
    hung: bool,
}

impl Steps {
    fn record(&mut self, label: &str, result: String) -> bool {
        let ok = result == "ok";
        self.list.push((label.to_owned(), result));
        ok
    }

    fn check(&mut self, label: &str, reply: Result<Reply, LaunchError>) -> bool {
        let result = match reply {
            Ok(r) => r.outcome(),
            Err(e) => format!("({e})"),
        };
        self.record(label, result)
    }

    fn outcome(&self) -> String {
        let bad: Vec<String> = self
            .list
            .iter()
            .filter(|(_, r)| r != "ok")
            .map(|(l, r)| format!("{l}={r}"))
            .collect();
        if bad.is_empty() {
            "ok".to_owned()
        } else {
            bad.join(" ")
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Lock,
    Checkpoint,
    Restore,
    Unlock,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Lock => "lock",
            Op::Checkpoint => "checkpoint",
            Op::Restore => "restore",
            Op::Unlock => "unlock",
        }
    }
}

/// Native calls, each bounded by the hang limit.
struct Ops {
    native: Arc<Driver>,
    limit: Duration,
    lock_ms: u32,
}

impl Ops {
    /// Runs `op` on `pid`; records it as `<prefix>op`. Nothing runs after a hang.
    fn run(&self, steps: &mut Steps, prefix: &str, pid: u32, op: Op) -> bool {
        self.run_with(steps, prefix, pid, op, Vec::new())
    }

    /// [`Ops::run`], a restore onto the GPUs `pairs` name (old UUID, new UUID).
    fn run_with(
        &self,
        steps: &mut Steps,
        prefix: &str,
        pid: u32,
        op: Op,
        pairs: Vec<(CUuuid, CUuuid)>,
    ) -> bool {
        if steps.hung {
            return false;
        }
        let native = Arc::clone(&self.native);
        let lock_ms = self.lock_ms;
        let result = bounded(self.limit, move || match op {
            Op::Lock => native.lock(pid, lock_ms),
            Op::Checkpoint => native.checkpoint(pid),
            Op::Restore => native.restore(pid, &pairs),
            Op::Unlock => native.unlock(pid),
        });
        let text = match result {
            Bounded::Done(Ok(())) => "ok".to_owned(),
            Bounded::Done(Err(e)) => native::outcome(&e),
            Bounded::Hung => {
                steps.hung = true;
                format!("hang>{}s", self.limit.as_secs())
            }
        };
        steps.record(&format!("{prefix}{}", op.name()), text)
    }

    /// Lock, checkpoint, `during`, restore, unlock of one process; a failed checkpoint or restore
    /// is followed by an unlock. Returns whether every step succeeded.
    fn cycle(
        &self,
        steps: &mut Steps,
        prefix: &str,
        pid: u32,
        during: impl FnOnce(&mut Steps),
    ) -> bool {
        self.cycle_onto(steps, prefix, pid, Vec::new(), during)
    }

    /// [`Ops::cycle`] with a restore onto the GPUs `pairs` name.
    fn cycle_onto(
        &self,
        steps: &mut Steps,
        prefix: &str,
        pid: u32,
        pairs: Vec<(CUuuid, CUuuid)>,
        during: impl FnOnce(&mut Steps),
    ) -> bool {
        if !self.run(steps, prefix, pid, Op::Lock) {
            return false;
        }
        if !self.run(steps, prefix, pid, Op::Checkpoint) {
            self.run(steps, prefix, pid, Op::Unlock);
            return false;
        }
        during(steps);
        if !self.run_with(steps, prefix, pid, Op::Restore, pairs) {
            self.run(steps, prefix, pid, Op::Unlock);
            return false;
        }
        self.run(steps, prefix, pid, Op::Unlock)
    }
}

/// Every scenario, in the order the GPU lane runs them (those that may hang last).
pub static SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "share-both-ways",
        about: "two processes each export a POSIX-fd VMM allocation to the other (dlsym route); \
                writes by either are seen by both",
        r580: "ok",
        hangs: false,
        run: |ctx| share_both_ways(ctx, Resolve::Dlsym),
    },
    Scenario {
        name: "share-both-ways-getprocaddress",
        about: "share-both-ways with every entry point resolved through cuGetProcAddress_v2",
        r580: "ok",
        hangs: false,
        run: |ctx| share_both_ways(ctx, Resolve::GetProcAddress),
    },
    Scenario {
        name: "share-ring4",
        about: "four processes in a ring: each imports its predecessor's allocation; writes \
                seen both ways",
        r580: "ok",
        hangs: false,
        run: share_ring4,
    },
    Scenario {
        name: "share-tree4",
        about: "share-ring4 inside one process tree (cuinterpose-workload tree), as under \
                cuinterpose run",
        r580: "ok",
        hangs: false,
        run: share_tree4,
    },
    Scenario {
        name: "vmm-errors",
        about: "every VMM (and legacy IPC) error path: each bad call's CUresult",
        r580: "",
        hangs: false,
        run: vmm_errors,
    },
    Scenario {
        name: "checkpoint-roundtrip",
        about: "native lock/checkpoint/restore/unlock from another process of a process with a \
                cuMemAlloc buffer and an unshared POSIX-capable VMM mapping: memory freed while \
                checkpointed, bytes back at the same addresses",
        r580: "ok",
        hangs: false,
        run: checkpoint_roundtrip,
    },
    Scenario {
        name: "device-remap",
        about: "native checkpoint of a process with a VMM allocation on device 0, restored with \
                GPU pairs that swap devices 0 and 1: same bytes at the same addresses, the \
                memory on the other GPU (fake usage per device), and the process's device 0 is \
                the new GPU (cuDeviceGetUuid); needs 2 devices",
        r580: "",
        hangs: false,
        run: device_remap,
    },
    Scenario {
        name: "importer-live-import",
        about: "the importer is checkpointed while it maps the import",
        r580: "restore=CUDA_ERROR_NOT_SUPPORTED unlock=CUDA_ERROR_ILLEGAL_STATE",
        hangs: false,
        run: importer_live_import,
    },
    Scenario {
        name: "importer-unmapped-holding",
        about: "the importer unmapped the import but still holds the imported handle",
        r580: "restore=CUDA_ERROR_NOT_SUPPORTED unlock=?",
        hangs: false,
        run: importer_unmapped_holding,
    },
    Scenario {
        name: "importer-released",
        about: "the importer unmapped and released its import; the creator (mapping kept) is \
                checkpointed and restored, exports again, the peer imports again; writes seen \
                both ways",
        r580: "ok",
        hangs: false,
        run: |ctx| importer_released(ctx, false),
    },
    Scenario {
        name: "importer-released-creator-unmapped",
        about: "importer-released with the creator's own mapping dropped before the checkpoint \
                and made again after restore",
        r580: "ok",
        hangs: false,
        run: |ctx| importer_released(ctx, true),
    },
    Scenario {
        name: "fd-held-by-third",
        about: "the exported descriptor is held only by a third process that never imports; \
                the creator is checkpointed and restored",
        r580: "ok",
        hangs: false,
        run: fd_held_by_third,
    },
    Scenario {
        name: "legacy-ipc-importer",
        about: "a legacy CUDA IPC importer (cuIpcOpenMemHandle) is checkpointed",
        r580: "restore=CUDA_ERROR_INVALID_VALUE unlock=?",
        hangs: false,
        run: legacy_ipc_importer,
    },
    Scenario {
        name: "pointer-attributes",
        about: "cuPointerGetAttribute(s) of cuMemAlloc memory (at its base and inside) and of a \
                mapping opened from its legacy IPC handle: device memory of the device, \
                legacy-IPC capable (the opened mapping not), the range of the requested size, \
                mapped; under the shim, where cuMemAlloc is VMM, the answers must not change",
        r580: "",
        hangs: false,
        run: pointer_attributes,
    },
    Scenario {
        name: "both-locked",
        about: "exporter and importer (live mapping) both locked, then both checkpointed, then \
                both restored and unlocked",
        r580: "b:restore=CUDA_ERROR_NOT_SUPPORTED b:unlock=CUDA_ERROR_ILLEGAL_STATE",
        hangs: false,
        run: both_locked,
    },
    Scenario {
        name: "exporter-live-import",
        about: "the exporter is checkpointed while the importer maps its allocation (the real \
                driver hangs; the fake times out)",
        r580: "hang (more than 6 minutes)",
        hangs: true,
        run: exporter_live_import,
    },
];

/// The scenario called `name`.
pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

/// The scenarios to run for `names` (all when empty), those that may hang last, without them if
/// `skip_hangs`. An unknown name is an error naming it.
pub fn select(names: &[String], skip_hangs: bool) -> Result<Vec<&'static Scenario>, String> {
    let mut chosen: Vec<&'static Scenario> = if names.is_empty() {
        SCENARIOS.iter().collect()
    } else {
        names
            .iter()
            .map(|n| find(n).ok_or_else(|| format!("unknown scenario {n:?}")))
            .collect::<Result<_, _>>()?
    };
    chosen.retain(|s| !(skip_hangs && s.hangs));
    chosen.sort_by_key(|s| s.hangs);
    Ok(chosen)
}

/// Runs one scenario in a fresh environment.
pub fn run(scenario: &'static Scenario, settings: &Settings) -> Vec<Outcome> {
    let start = Instant::now();
    let cases = TestEnv::new(settings.artifacts.clone(), settings.driver, settings.shim)
        .and_then(|env| {
            let ctx = Ctx {
                env,
                settings,
                native: OnceLock::new(),
            };
            (scenario.run)(&ctx)
        })
        .unwrap_or_else(|e| single(format!("error: {e}")));
    let seconds = start.elapsed().as_secs_f64();
    cases
        .into_iter()
        .map(|c| Outcome {
            scenario: scenario.name,
            case: c.case,
            outcome: c.outcome,
            r580: scenario.r580,
            seconds,
        })
        .collect()
}

/// Runs the scenario called `name` (for tests).
pub fn run_named(name: &str, settings: &Settings) -> Result<Vec<Outcome>, String> {
    let scenario = find(name).ok_or_else(|| format!("unknown scenario {name:?}"))?;
    Ok(run(scenario, settings))
}

fn fill_and_check(
    steps: &mut Steps,
    writer: &Workload,
    reader: &Workload,
    region: &str,
    seed: u64,
) -> bool {
    let w = steps.check(
        &format!("{}:fill-{region}-{seed}", writer.name()),
        writer.cmd(&format!("fill {region} {seed}")),
    );
    w && steps.check(
        &format!("{}:verify-{region}-{seed}", reader.name()),
        reader.cmd(&format!("verify {region} {seed}")),
    )
}

fn share_both_ways(ctx: &Ctx, resolve: Resolve) -> Result<Vec<Case>, HarnessError> {
    let g = Group::spawn(&ctx.env, 2, |r| {
        WorkloadOptions::new(format!("w{r}")).resolve(resolve)
    })?;
    let size = ctx.size(&g[0])?;
    g.create_shared(0, "a0", size)?;
    g.create_shared(1, "a1", size)?;
    g.share(0, 1, "a0", size)?;
    g.share(1, 0, "a1", size)?;
    let mut steps = Steps::default();
    fill_and_check(&mut steps, &g[0], &g[1], "a0", 11);
    fill_and_check(&mut steps, &g[1], &g[0], "a0", 12);
    fill_and_check(&mut steps, &g[1], &g[0], "a1", 13);
    fill_and_check(&mut steps, &g[0], &g[1], "a1", 14);
    Ok(single(steps.outcome()))
}

fn ring_checks(g: &Group) -> String {
    let n = g.len();
    let mut steps = Steps::default();
    for i in 0..n {
        let j = (i + 1) % n;
        let region = format!("a{i}");
        fill_and_check(&mut steps, &g[i], &g[j], &region, 100 + i as u64);
        fill_and_check(&mut steps, &g[j], &g[i], &region, 200 + i as u64);
    }
    steps.outcome()
}

fn share_ring4(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let g = Group::spawn(&ctx.env, 4, |r| WorkloadOptions::new(format!("w{r}")))?;
    g.ring(ctx.size(&g[0])?)?;
    Ok(single(ring_checks(&g)))
}

fn share_tree4(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let g = Group::tree(&ctx.env, 4, WorkloadOptions::new("t"))?;
    g.ring(ctx.size(&g[0])?)?;
    Ok(single(ring_checks(&g)))
}

/// Every probe's result, each probe run in the probe process (crate::probes) as a workload would be
/// started. A probe that kills its process (the real driver dereferences some null pointers and
/// dies of SIGSEGV) is found by the name the process logged before running it; it is reported as
/// `crash` and the others run again in a fresh process that skips it.
fn vmm_errors(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let mut crashed: Vec<(String, String)> = Vec::new();
    for attempt in 1..=PROBES.len() + 1 {
        let name = format!("probe-errors-{attempt}");
        let skip: Vec<&str> = crashed.iter().map(|(n, _)| n.as_str()).collect();
        let (status, log) = match probes::run_process(&ctx.env, &name, &skip)? {
            Ended::Answered(cases) => return Ok(probe_cases(&cases, &crashed)),
            Ended::Died { status, log } => (status, log),
        };
        // Not a crash unless its log names a probe not yet skipped.
        match last_running(&log) {
            Some(probe) if !crashed.iter().any(|(n, _)| n == probe) => {
                crashed.push((probe.to_owned(), death(status)));
            }
            _ => {
                return Err(HarnessError::Probes {
                    what: format!("{name} ended ({status}) without naming a new probe"),
                    log,
                });
            }
        }
    }
    Err(HarnessError::Probes {
        what: format!("every probe killed its process: {crashed:?}"),
        log: String::new(),
    })
}

/// `crash` for a death by signal (what a bad pointer does to the real driver), else `exit:N`.
fn death(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.signal(), status.code()) {
        (Some(_), _) => "crash".to_owned(),
        (None, Some(code)) => format!("exit:{code}"),
        (None, None) => "crash".to_owned(),
    }
}

/// The cases a probe process answered, in probe order, with the probes that killed earlier
/// processes in their places.
fn probe_cases(cases: &[serde_json::Value], crashed: &[(String, String)]) -> Vec<Case> {
    let answered: Vec<(&str, &str)> = cases
        .iter()
        .filter_map(|c| {
            let case = c.get("case").and_then(|v| v.as_str())?;
            Some((
                case,
                c.get("result").and_then(|v| v.as_str()).unwrap_or("?"),
            ))
        })
        .collect();
    let mut out = Vec::with_capacity(PROBES.len());
    for probe in PROBES {
        let outcome = crashed
            .iter()
            .find(|(n, _)| n == probe.name)
            .map(|(_, how)| how.as_str())
            .or_else(|| {
                answered
                    .iter()
                    .find(|(c, _)| *c == probe.name)
                    .map(|(_, r)| *r)
            });
        if let Some(outcome) = outcome {
            out.push(Case {
                case: Some(probe.name.to_owned()),
                outcome: outcome.to_owned(),
            });
        }
    }
    out
}

fn checkpoint_roundtrip(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let w = ctx.spawn("w")?;
    let observer = ctx.spawn("observer")?;
    let size = ctx.size(&w)?;
    w.all_ok(&[
        &format!("malloc m {size}"),
        "fill m 21",
        &format!("create v {size} --handle-types posix"),
        &format!("reserve rv {size}"),
        "map v rv",
        "set-access v",
        "fill v 22",
    ])?;
    let before = w.regions()?;
    let free_before = observer.ok("mem-info")?.u64("free").unwrap_or(0);
    let fake = ctx.env.driver() == DriverKind::Fake;
    let usage_before = if fake {
        ctx.env.fake_usage(w.pid(), w.device())?
    } else {
        0
    };
    let mut steps = Steps::default();
    let cycled = ops.cycle(&mut steps, "", w.pid(), |steps| {
        let freed = observer
            .ok("mem-info")
            .map(|r| r.u64("free").unwrap_or(0).saturating_sub(free_before));
        let result = match freed {
            Ok(f) if f >= 2 * size => "ok".to_owned(),
            Ok(f) => format!("short:{f}"),
            Err(e) => format!("({e})"),
        };
        steps.record("freed", result);
        if fake {
            let result = match ctx.env.fake_usage(w.pid(), w.device()) {
                Ok(0) if usage_before >= 2 * size => "ok".to_owned(),
                Ok(0) => format!("before:{usage_before}"),
                Ok(n) => format!("left:{n}"),
                Err(e) => format!("({e})"),
            };
            steps.record("usage", result);
        }
    });
    if cycled {
        steps.check("verify-m", w.cmd("verify m 21"));
        steps.check("verify-v", w.cmd("verify v 22"));
        let same = match w.regions() {
            Ok(after) if after == before => "ok".to_owned(),
            Ok(_) => "moved".to_owned(),
            Err(e) => format!("({e})"),
        };
        steps.record("addresses", same);
    }
    Ok(single(steps.outcome()))
}

fn device_remap(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let uuids = ops.native.device_uuids()?;
    let (Some(&gpu0), Some(&gpu1)) = (uuids.first(), uuids.get(1)) else {
        return Ok(single("skipped: needs 2 devices".to_owned()));
    };
    let hex = |u: CUuuid| grammar::to_hex(&u.bytes.map(|b| b as u8));
    let w = ctx.spawn("w")?;
    let size = ctx.size(&w)?;
    w.all_ok(&[
        &format!("create v {size} --device 0 --handle-types posix"),
        &format!("reserve rv {size}"),
        "map v rv",
        "set-access v --device 0",
        "fill v 61",
    ])?;
    let before = w.regions()?;
    let fake = ctx.env.driver() == DriverKind::Fake;
    let usage = |device: i32| ctx.env.fake_usage(w.pid(), device);
    let mut steps = Steps::default();
    let seen = |steps: &mut Steps, label: &str, device: u32, expected: CUuuid| {
        let result = match w.ok(&format!("uuid --device {device}")) {
            Ok(r) if r.str("uuid") == Some(hex(expected).as_str()) => "ok".to_owned(),
            Ok(r) => format!("uuid:{}", r.str("uuid").unwrap_or("?")),
            Err(e) => format!("({e})"),
        };
        steps.record(label, result);
    };
    seen(&mut steps, "uuid0-before", 0, gpu0);
    if fake {
        let result = match (usage(0), usage(1)) {
            (Ok(u0), Ok(0)) if u0 >= size => "ok".to_owned(),
            (Ok(u0), Ok(u1)) => format!("dev0:{u0}/dev1:{u1}"),
            (Err(e), _) | (_, Err(e)) => format!("({e})"),
        };
        steps.record("usage-before", result);
    }
    let swap = vec![(gpu0, gpu1), (gpu1, gpu0)];
    if ops.cycle_onto(&mut steps, "", w.pid(), swap, |_| {}) {
        steps.check("verify-v", w.cmd("verify v 61"));
        let same = match w.regions() {
            Ok(after) if after == before => "ok".to_owned(),
            Ok(_) => "moved".to_owned(),
            Err(e) => format!("({e})"),
        };
        steps.record("addresses", same);
        seen(&mut steps, "uuid0-after", 0, gpu1);
        seen(&mut steps, "uuid1-after", 1, gpu0);
        if fake {
            let result = match (usage(0), usage(1)) {
                (Ok(0), Ok(u1)) if u1 >= size => "ok".to_owned(),
                (Ok(u0), Ok(u1)) => format!("dev0:{u0}/dev1:{u1}"),
                (Err(e), _) | (_, Err(e)) => format!("({e})"),
            };
            steps.record("usage-after", result);
        }
        steps.check("fill-after", w.cmd("fill v 62"));
        steps.check("verify-after", w.cmd("verify v 62"));
    }
    Ok(single(steps.outcome()))
}

/// A creates `a0` (mapped, filled with 31, exported); B imports and maps it, checks the bytes,
/// and closes the descriptor it received (as NCCL does).
fn one_way_pair(ctx: &Ctx) -> Result<(Workload, Workload, u64), HarnessError> {
    let a = ctx.spawn("a")?;
    let b = ctx.spawn("b")?;
    let size = ctx.size(&a)?;
    a.all_ok(&[
        &format!("create a0 {size} --handle-types posix"),
        &format!("reserve r-a0 {size}"),
        "map a0 r-a0",
        "set-access a0",
        "fill a0 31",
        "export a0",
        &format!("send-fd a0 --to {}", b.socket().display()),
    ])?;
    b.all_ok(&[
        &format!("import a0 --size {size}"),
        "close-fd a0",
        &format!("reserve r-a0 {size}"),
        "map a0 r-a0",
        "set-access a0",
        "verify a0 31",
    ])?;
    Ok((a, b, size))
}

fn importer_live_import(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let (_a, b, _) = one_way_pair(ctx)?;
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", b.pid(), |_| {}) {
        steps.check("verify-a0", b.cmd("verify a0 31"));
    }
    Ok(single(steps.outcome()))
}

fn importer_unmapped_holding(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let (_a, b, _) = one_way_pair(ctx)?;
    b.ok("unmap a0")?;
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", b.pid(), |_| {}) {
        steps.check("map-again", b.cmd("map a0 r-a0"));
        steps.check("set-access", b.cmd("set-access a0"));
        steps.check("verify-a0", b.cmd("verify a0 31"));
    }
    Ok(single(steps.outcome()))
}

fn importer_released(ctx: &Ctx, creator_unmaps: bool) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let (a, b, size) = one_way_pair(ctx)?;
    b.all_ok(&["unmap a0", "release a0"])?;
    a.ok("close-fd a0")?;
    if creator_unmaps {
        a.ok("unmap a0")?;
    }
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", a.pid(), |_| {}) {
        if creator_unmaps {
            steps.check("a:map-again", a.cmd("map a0 r-a0"));
            steps.check("a:set-access", a.cmd("set-access a0"));
        }
        steps.check("a:verify-a0", a.cmd("verify a0 31"));
        steps.check("a:export", a.cmd("export a0"));
        steps.check(
            "a:send-fd",
            a.cmd(&format!("send-fd a0 --to {}", b.socket().display())),
        );
        steps.check("b:import", b.cmd(&format!("import a0 --size {size}")));
        steps.check("b:map", b.cmd("map a0 r-a0"));
        steps.check("b:set-access", b.cmd("set-access a0"));
        steps.check("b:verify-a0", b.cmd("verify a0 31"));
        fill_and_check(&mut steps, &b, &a, "a0", 32);
        fill_and_check(&mut steps, &a, &b, "a0", 33);
    }
    Ok(single(steps.outcome()))
}

fn fd_held_by_third(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let a = ctx.spawn("a")?;
    let c = ctx.spawn("c")?;
    let size = ctx.size(&a)?;
    a.all_ok(&[
        &format!("create a0 {size} --handle-types posix"),
        &format!("reserve r-a0 {size}"),
        "map a0 r-a0",
        "set-access a0",
        "fill a0 41",
        "export a0",
        &format!("send-fd a0 --to {}", c.socket().display()),
        "close-fd a0",
    ])?;
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", a.pid(), |_| {}) {
        steps.check("verify-a0", a.cmd("verify a0 41"));
    }
    Ok(single(steps.outcome()))
}

fn legacy_ipc_importer(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let a = ctx.spawn("a")?;
    let b = ctx.spawn("b")?;
    let size = ctx.size(&a)?;
    a.all_ok(&[
        &format!("malloc m {size}"),
        "fill m 51",
        "ipc-get h m",
        &format!("send-ipc h --to {}", b.socket().display()),
    ])?;
    b.all_ok(&["ipc-open m --blob h", "verify m 51"])?;
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", b.pid(), |_| {}) {
        steps.check("verify-m", b.cmd("verify m 51"));
    }
    Ok(single(steps.outcome()))
}

fn pointer_attributes(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let a = ctx.spawn("a")?;
    let b = ctx.spawn("b")?;
    // Not a multiple of the granularity: the range must be the requested size, not the backing.
    let requested = ctx.size(&a)? - (1 << 20) + 16;
    a.all_ok(&[
        &format!("malloc m {requested}"),
        "ipc-get h m",
        &format!("send-ipc h --to {}", b.socket().display()),
    ])?;
    b.all_ok(&["ipc-open m --blob h"])?;
    let mut steps = Steps::default();
    for (w, legacy) in [(&a, 1), (&b, 0)] {
        let base = w.regions()?.get("m").map_or(0, |r| r.base);
        let expected = [
            ("memory_type", u64::from(cuda_abi::memory_type::DEVICE)),
            ("device", u64::try_from(w.device()).unwrap_or(u64::MAX)),
            ("legacy_ipc", legacy),
            ("range_start", base),
            ("range_size", requested),
            ("mapped", 1),
        ];
        for spec in ["m", "m --offset 8192"] {
            let label = format!("{}:attrs-{}", w.name(), spec.replace(" --offset ", "+"));
            let result = match w.cmd(&format!("pointer-attrs {spec}")) {
                Ok(r) if r.ok => {
                    let wrong: Vec<String> = expected
                        .iter()
                        .filter(|(k, v)| r.u64(k) != Some(*v))
                        .map(|(k, _)| {
                            format!("{k}:{}", r.u64(k).map_or("-".into(), |v| format!("{v:#x}")))
                        })
                        .collect();
                    if wrong.is_empty() {
                        "ok".to_owned()
                    } else {
                        wrong.join(",")
                    }
                }
                Ok(r) => r.outcome(),
                Err(e) => format!("({e})"),
            };
            steps.record(&label, result);
        }
    }
    Ok(single(steps.outcome()))
}

fn both_locked(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let (a, b, _) = one_way_pair(ctx)?;
    let mut steps = Steps::default();
    let (pa, pb) = (a.pid(), b.pid());
    let locked_b = ops.run(&mut steps, "b:", pb, Op::Lock);
    let locked_a = ops.run(&mut steps, "a:", pa, Op::Lock);
    let ckpt_b = locked_b && ops.run(&mut steps, "b:", pb, Op::Checkpoint);
    let ckpt_a = locked_a && ops.run(&mut steps, "a:", pa, Op::Checkpoint);
    let restored_a = ckpt_a && ops.run(&mut steps, "a:", pa, Op::Restore);
    if ckpt_b {
        ops.run(&mut steps, "b:", pb, Op::Restore);
    }
    let unlocked_a = locked_a && ops.run(&mut steps, "a:", pa, Op::Unlock);
    if locked_b {
        ops.run(&mut steps, "b:", pb, Op::Unlock);
    }
    if restored_a && unlocked_a {
        steps.check("a:verify-a0", a.cmd("verify a0 31"));
    }
    Ok(single(steps.outcome()))
}

fn exporter_live_import(ctx: &Ctx) -> Result<Vec<Case>, HarnessError> {
    let ops = ctx.native()?;
    let (a, _b, _) = one_way_pair(ctx)?;
    let mut steps = Steps::default();
    if ops.cycle(&mut steps, "", a.pid(), |_| {}) {
        steps.check("verify-a0", a.cmd("verify a0 31"));
    }
    Ok(single(steps.outcome()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_hangs_sort_last() {
        let mut names: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SCENARIOS.len());
        let all = select(&[], false).unwrap();
        let first_hang = all.iter().position(|s| s.hangs).unwrap();
        assert!(all[first_hang..].iter().all(|s| s.hangs));
        assert!(select(&[], true).unwrap().iter().all(|s| !s.hangs));
        assert!(select(&["nope".to_owned()], false).is_err());
    }

    #[test]
    fn probes_that_killed_their_process_keep_their_place_as_crash() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(death(std::process::ExitStatus::from_raw(11)), "crash");
        assert_eq!(death(std::process::ExitStatus::from_raw(3 << 8)), "exit:3");
        let (first, second, third) = (PROBES[0].name, PROBES[1].name, PROBES[2].name);
        let answered = [
            json!({"case": first, "call": "x", "result": "CUDA_ERROR_INVALID_VALUE"}),
            json!({"case": third, "call": "x", "result": "CUDA_SUCCESS"}),
        ];
        let crashed = vec![(second.to_owned(), "crash".to_owned())];
        let cases = probe_cases(&answered, &crashed);
        let got: Vec<(Option<&str>, &str)> = cases
            .iter()
            .map(|c| (c.case.as_deref(), c.outcome.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (Some(first), "CUDA_ERROR_INVALID_VALUE"),
                (Some(second), "crash"),
                (Some(third), "CUDA_SUCCESS"),
            ]
        );
    }

    #[test]
    fn outcome_lists_only_what_went_wrong() {
        let mut s = Steps::default();
        s.record("lock", "ok".into());
        assert_eq!(s.outcome(), "ok");
        s.record("restore", "CUDA_ERROR_NOT_SUPPORTED".into());
        s.record("unlock", "CUDA_ERROR_ILLEGAL_STATE".into());
        assert_eq!(
            s.outcome(),
            "restore=CUDA_ERROR_NOT_SUPPORTED unlock=CUDA_ERROR_ILLEGAL_STATE"
        );
    }
}
