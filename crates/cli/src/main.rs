//! `cuinterpose`: checkpoint and restore GPU processes that share CUDA memory.
//!
//! Thin by design: arguments, progress, logging and exit codes. What the commands do lives in
//! `cuinterpose-control`.

#![forbid(unsafe_code)]

mod bench;
mod bench_tables;
mod demo;
mod docs;
mod doctor;
mod output;
mod progress;
mod run;

use anyhow::Context;
use clap::{Parser, Subcommand};
use control::capture::{
    self, PrepareError, ResumeError, ResumeOptions, SuspendError, SuspendOptions,
};
use control::discard::DiscardError;
use control::disk::{self, CheckpointError, RestoreError};
use control::end::EndError;
use control::runtimes::ContainerRef;
use control::{Classified, ControlError, ErrorClass};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Exit codes, documented in `--help`, the README and docs/recovery.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    /// Anything unexpected.
    Error = 1,
    /// Bad arguments (clap's own code) or a setting that does not parse.
    Usage = 2,
    /// Refused before anything changed: the workload runs as before.
    Refused = 3,
    /// Failed, then rolled back: the workload runs as before (a drain past `--freeze-timeout`:
    /// every gate open again, nothing released; a restore: what it brought back was killed, the
    /// checkpoint is unchanged).
    RolledBack = 4,
    /// Failed after the native lock or while rebuilding: the workload needs attention.
    NeedsAttention = 5,
    /// `doctor`: a check failed (this machine lacks something the product needs).
    CheckFailed = 6,
}

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  unexpected error
  2  bad arguments or a bad setting (an environment variable of docs/settings.md)
  3  refused before anything changed (the workload runs as before)
  4  failed and rolled back (the workload runs as before; a capture not drained within
     --freeze-timeout: every gate open again, nothing released; a restore: what it brought
     back was killed, the checkpoint is unchanged)
  5  failed after the native lock or while rebuilding (the workload needs attention)
  6  doctor: a check failed (each failed line says what to fix)";

#[derive(Debug, Parser)]
#[command(name = "cuinterpose", version, about, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a program with the interposer preloaded (prepends libcuinterpose.so to LD_PRELOAD, then execs)
    Run(run::RunArgs),
    /// Show the CUDA processes under a root, which lack the shim, and who shares what with whom
    Inspect(InspectArgs),
    /// Free all GPU memory of a running group in place (its processes stay alive)
    Suspend(SuspendArgs),
    /// Pin the carriers of a running group ahead of its first suspend (in the carrier helper, or
    /// with --keep-contexts in each process's own carrier; off the application's path, within
    /// CUINTERPOSE_PIN_AHEAD_MIB), so that the first cycle runs at the rate of later ones; run it
    /// once the workload has made its allocations
    Prepare(PrepareArgs),
    /// Bring a suspended group back with every address, handle, content and sharing intact
    Resume(ResumeArgs),
    /// End a suspended group that cannot be brought back (its carrier's bytes lost, a multicast
    /// object missing a member): kill its processes and remove its state
    End(EndArgs),
    /// Capture the group and dump it to disk with CRIU (the workload must run in its own PID namespace)
    Checkpoint(CheckpointArgs),
    /// Restore a checkpoint into new processes, optionally onto other GPUs
    Restore(RestoreArgs),
    /// Delete a checkpoint on disk with the files it keeps outside its directory (CRIU's link remaps)
    Discard(DiscardArgs),
    /// Start a small group sharing memory, suspend it, prove the memory was freed, resume and verify
    Demo(demo::DemoArgs),
    /// Measure the shim's overhead, suspend/resume copy rates and the native checkpoint baseline
    Bench(bench::BenchArgs),
    /// Check that this machine has what cuinterpose needs (driver, GPUs, CRIU, kernel, privileges,
    /// memory), one line each with what to fix; exit code 6 when a check fails
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell)
    Completions(docs::CompletionsArgs),
    /// Print the manual page (roff), or write every page into a directory
    Man(docs::ManArgs),
    /// Print the layout of the CUDA structs this build mirrors (compared with cuda.h by the GPU lane)
    #[command(hide = true)]
    AbiLayout,
    /// The carrier helper of a control directory (started by `suspend --carrier helper`)
    #[command(hide = true)]
    CarrierHelper(CarrierHelperArgs),
}

/// The arguments of `inspect`.
#[derive(Debug, clap::Args)]
struct InspectArgs {
    /// Root of the process tree: the workload's first process, or the `run --pid-namespace` launcher
    #[arg(long)]
    pid: u32,
    /// Where `suspend` put a suspended group's state, to show how it was suspended (default:
    /// $TMPDIR/cuinterpose-suspended-<pid>)
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The CUDA driver library the tool loads to read each GPU's free memory, for the carrier
    /// a suspend would choose (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Print JSON instead of tables
    #[arg(long)]
    json: bool,
}

/// The arguments of `suspend`.
#[derive(Debug, clap::Args)]
struct SuspendArgs {
    /// Root of the process tree: the workload's first process, or the `run --pid-namespace` launcher
    #[arg(long)]
    pid: u32,
    /// Where the captured topology goes (default: $TMPDIR/cuinterpose-suspended-<pid>)
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Seconds the shims get to finish tracked calls in flight before the capture is refused
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    freeze_timeout: u64,
    /// The CUDA driver library the tool loads (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Free the shim's memory but skip the driver's checkpoint (and, at resume, its restore):
    /// contexts, modules and streams stay resident (a few hundred MiB per process)
    #[arg(long)]
    keep_contexts: bool,
    /// Where the group's bytes wait until the resume: `auto`, the fastest the machine allows
    /// (the helper for a group prepared with `cuinterpose prepare` where every GPU has room for
    /// its context and RLIMIT_MEMLOCK and host memory allow its pinning, else each process's own
    /// carrier; the report says which and why); `process`, each process's own host carrier; or `helper`, a carrier helper
    /// process that keeps them pinned between cycles (copies at the link's rate, no pinned
    /// memory in the application at its native checkpoint; its context stays on each GPU),
    /// refused where the machine cannot hold it
    #[arg(long, value_enum, default_value_t = CarrierPlace::Auto)]
    carrier: CarrierPlace,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `prepare`.
#[derive(Debug, clap::Args)]
struct PrepareArgs {
    /// Root of the process tree: the workload's first process, or the `run --pid-namespace` launcher
    #[arg(long)]
    pid: u32,
    /// The CUDA driver library the tool (and the helper it starts) loads (default:
    /// libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Prepare for `suspend --keep-contexts`: each shim pins its own carrier (which such a cycle
    /// copies through), instead of the carrier helper pinning one
    #[arg(long)]
    keep_contexts: bool,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `resume`.
#[derive(Debug, clap::Args)]
struct ResumeArgs {
    /// Root of the process tree: the workload's first process, or the `run --pid-namespace` launcher
    #[arg(long)]
    pid: u32,
    /// Where `suspend` put the captured topology (default: $TMPDIR/cuinterpose-suspended-<pid>)
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Bring back the processes still alive when captured ones have exited (their imports
    /// from the exited ones stay unmapped and are listed)
    #[arg(long)]
    allow_lost: bool,
    /// The CUDA driver library the tool loads (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `end`.
#[derive(Debug, clap::Args)]
struct EndArgs {
    /// Root of the process tree, as given to `suspend` (or the restored root)
    #[arg(long)]
    pid: u32,
    /// Where `suspend` put the captured topology (default: $TMPDIR/cuinterpose-suspended-<pid>)
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `checkpoint`.
#[derive(Debug, clap::Args)]
struct CheckpointArgs {
    /// The `run --pid-namespace` launcher of the workload (or the init of its PID namespace)
    #[arg(long, required_unless_present = "container")]
    pid: Option<u32>,
    /// The container whose init is the workload's root, by its runtime's name for it:
    /// `podman:NAME` or `containerd:ID` (a task of `ctr task ls`; CONTAINERD_ADDRESS and
    /// CONTAINERD_NAMESPACE as ctr reads them); the runtime gives its init's PID
    #[arg(long, value_name = "RUNTIME:NAME", conflicts_with = "pid")]
    container: Option<ContainerRef>,
    /// Checkpoint directory (created; must not hold a checkpoint yet)
    #[arg(long)]
    dir: PathBuf,
    /// Resume the group in place after the dump instead of letting CRIU end it
    #[arg(long)]
    leave_running: bool,
    /// Keep the GPU bytes in data files in DIR instead of the block store beside it
    /// (`<parent of DIR>/.cuinterpose-blocks`, shared with the checkpoints there): for a
    /// directory that is copied elsewhere on its own
    #[arg(long)]
    self_contained: bool,
    /// The CRIU binary (default: $CUINTERPOSE_CRIU, the CRIU bundled with the tool, then criu on PATH)
    #[arg(long)]
    criu: Option<PathBuf>,
    /// Seconds the shims get to finish tracked calls in flight before the capture is refused
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    freeze_timeout: u64,
    /// The CUDA driver library the tool loads (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `restore`.
#[derive(Debug, clap::Args)]
struct RestoreArgs {
    /// The checkpoint directory `checkpoint --dir` wrote
    #[arg(long)]
    dir: PathBuf,
    /// GPU remapping by ordinal, OLD=NEW[,OLD=NEW...]: the GPU recorded as OLD becomes NEW here
    #[arg(long, value_parser = parse_device_map)]
    device_map: Option<DeviceMap>,
    /// Restore into the network, IPC and UTS namespaces of process PID, for each of them the
    /// checkpointed tree did not share with the tool (a pod's: its sandbox held them); needed
    /// when the tree had a network namespace of its own, which CRIU does not dump
    #[arg(long, value_name = "PID")]
    namespaces_of: Option<u32>,
    /// Restore into the container named so by its runtime (`podman:NAME`, `containerd:ID`):
    /// `--namespaces-of` its init, whose root filesystem and cgroups the tree then takes
    #[arg(long, value_name = "RUNTIME:NAME", conflicts_with = "namespaces_of")]
    container: Option<ContainerRef>,
    /// Read every data file and check its digests before CRIU runs, so that a damaged one is
    /// refused before any process is created (default: lengths first, digests while the shims
    /// load, a damaged file undoing the restore before its processes resume; one read less)
    #[arg(long)]
    verify_data_first: bool,
    /// Restore a checkpoint that is unsigned, or whose signature does not verify with the key
    /// of CUINTERPOSE_SIGNING_KEY (with a warning), instead of refusing it: only for a
    /// checkpoint whose origin you trust
    #[arg(long)]
    allow_unsigned: bool,
    /// The CRIU binary (default: $CUINTERPOSE_CRIU, the CRIU bundled with the tool, then criu on PATH)
    #[arg(long)]
    criu: Option<PathBuf>,
    /// The CUDA driver library the tool loads (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Restore nothing: clean up after an interrupted restore of DIR (kill the tree it brought
    /// back, if one still runs, and remove its work files); the checkpoint is not touched
    #[arg(long, conflicts_with_all = ["device_map", "namespaces_of", "container", "verify_data_first", "allow_unsigned", "criu", "driver"])]
    cleanup: bool,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `discard`.
#[derive(Debug, clap::Args)]
struct DiscardArgs {
    /// The checkpoint directory to delete
    #[arg(long)]
    dir: PathBuf,
    /// Print a JSON report instead of text
    #[arg(long)]
    json: bool,
}

/// The arguments of `carrier-helper`.
#[derive(Debug, clap::Args)]
struct CarrierHelperArgs {
    /// The socket to listen on
    #[arg(long)]
    socket: PathBuf,
    /// The CUDA driver library (default: libcuda.so.1 from the loader's path)
    #[arg(long)]
    driver: Option<PathBuf>,
    /// Seconds without any carrier held after which the helper exits
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    idle: u64,
}

/// `suspend --carrier` (and `bench --carrier`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CarrierPlace {
    /// The fastest the machine allows (control::carrier_choice)
    Auto,
    /// Each process's own carrier
    Process,
    /// The carrier helper of the shims' control directory
    Helper,
}

impl From<CarrierPlace> for control::carrier_choice::Requested {
    fn from(place: CarrierPlace) -> Self {
        use control::carrier_choice::Requested;
        match place {
            CarrierPlace::Auto => Requested::Auto,
            CarrierPlace::Process => Requested::Process,
            CarrierPlace::Helper => Requested::Helper,
        }
    }
}

impl CarrierPlace {
    /// Sets what a suspend asks for, and how it starts the carrier helper (this program,
    /// loading `driver`) should it choose one.
    pub(crate) fn apply(self, options: &mut SuspendOptions) -> anyhow::Result<()> {
        options.carrier = self.into();
        options.helper = Some(control::carrier_helper::HelperLaunch {
            program: std::env::current_exe()
                .context("finding this program, to start the carrier helper")?,
            driver: options.driver.clone(),
        });
        Ok(())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Read once; a setting that does not parse is a bad argument given another way.
    let config = match control::config::ToolConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("cuinterpose: {error}");
            return ExitCode::from(Exit::Usage as u8);
        }
    };
    if let Err(error) = init_logging(&config) {
        eprintln!("cuinterpose: {error}");
        return ExitCode::from(Exit::Usage as u8);
    }
    control::runlock::configure(&config);
    match execute(cli.command, &config) {
        Ok(()) => ExitCode::from(Exit::Success as u8),
        Err(error) => {
            let exit = exit_for(&error);
            eprintln!("cuinterpose: {}", message(&error));
            ExitCode::from(exit as u8)
        }
    }
}

fn init_logging(config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .with_context(|| format!("CUINTERPOSE_LOG={:?} is not a log filter", config.log))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}

/// A bad argument found once clap has parsed the command line (a program that does not exist,
/// a path of the wrong kind, a value out of range): exit 2, as for the ones clap finds.
#[derive(Debug)]
pub(crate) struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// The error and its causes, each said once: most layers' messages name their cause already
/// (`state file X: {source}`), so a cause whose text is in what was said already is left out
/// (anyhow's `{:#}` would repeat it: "a fifo: a fifo: a fifo").
fn message(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Every error type that classifies itself (`control::Classified`), each as a function that finds
/// it in an error: `ControlError` and each verb's own. A verb's error type added to the library
/// is added here, or its failures leave by exit 1.
const CLASSIFIED: &[fn(&anyhow::Error) -> Option<ErrorClass>] = &[
    class_of::<ControlError>,
    class_of::<EndError>,
    class_of::<DiscardError>,
    class_of::<RestoreError>,
    class_of::<CheckpointError>,
    class_of::<SuspendError>,
    class_of::<ResumeError>,
    class_of::<PrepareError>,
];

/// `error`'s class if it is an `E`: `downcast_ref` looks through the context the verbs add.
fn class_of<E: Classified>(error: &anyhow::Error) -> Option<ErrorClass> {
    error.downcast_ref::<E>().map(Classified::class)
}

/// Maps an error to its documented exit code by what it says about the workload.
fn exit_for(error: &anyhow::Error) -> Exit {
    if error.downcast_ref::<Usage>().is_some() {
        return Exit::Usage;
    }
    // Each operation's own error type classifies itself.
    let class = CLASSIFIED.iter().find_map(|find| find(error));
    match class {
        Some(ErrorClass::Refused) => Exit::Refused,
        Some(ErrorClass::RolledBack) => Exit::RolledBack,
        Some(ErrorClass::NeedsAttention) => Exit::NeedsAttention,
        Some(ErrorClass::Error) | None => Exit::Error,
    }
}

/// `--device-map`'s value. An alias, so that clap takes the whole list as one value: a field typed
/// `Vec<_>` would be read as an argument given many times (and clap panics at run time).
type DeviceMap = Vec<(u32, u32)>;

/// `0=1,1=0` → [(0, 1), (1, 0)].
fn parse_device_map(text: &str) -> Result<DeviceMap, String> {
    text.split(',')
        .map(|pair| {
            let (old, new) = pair
                .split_once('=')
                .ok_or_else(|| format!("{pair:?} is not OLD=NEW"))?;
            let parse = |s: &str| {
                s.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{s:?} is not a device ordinal"))
            };
            Ok((parse(old)?, parse(new)?))
        })
        .collect()
}

/// What `suspend` and `checkpoint` share: the capture of the group under `pid`.
fn capture_options(
    pid: u32,
    freeze_timeout_s: u64,
    driver: Option<PathBuf>,
    config: &control::config::ToolConfig,
) -> SuspendOptions {
    let mut options = SuspendOptions::new(pid, config);
    options.freeze_timeout = Duration::from_secs(freeze_timeout_s);
    options.driver = driver;
    options
}

fn execute(command: Command, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(args, config),
        Command::Inspect(InspectArgs {
            pid,
            state_dir,
            driver,
            json,
        }) => inspect(pid, state_dir.as_deref(), driver.as_deref(), json, config),
        Command::Suspend(args) => suspend(args, config),
        Command::Prepare(args) => prepare(args, config),
        Command::Resume(args) => resume(args, config),
        Command::Checkpoint(args) => checkpoint(args, config),
        Command::Restore(RestoreArgs {
            dir,
            cleanup: true,
            json,
            ..
        }) => {
            let report = disk::leftovers::cleanup(&dir)
                .with_context(|| format!("cleaning up after a restore of {}", dir.display()))?;
            output::print_cleanup(&dir, &report, json)
        }
        Command::Restore(RestoreArgs {
            dir,
            device_map,
            namespaces_of,
            container,
            verify_data_first,
            allow_unsigned,
            criu,
            driver,
            cleanup: false,
            json,
        }) => {
            let namespaces_of = match container {
                Some(container) => Some(control::runtimes::init_pid(&container)?),
                None => namespaces_of,
            };
            let options = disk::RestoreOptions {
                dir,
                device_map: device_map.unwrap_or_default(),
                namespaces_of,
                verify_data_first,
                allow_unsigned,
                criu,
                driver,
                config: config.clone(),
            };
            restore(&options, json)
        }
        Command::End(args) => end(args, config),
        Command::Discard(DiscardArgs { dir, json }) => {
            let report = control::discard::discard(&dir)
                .with_context(|| format!("discarding {}", dir.display()))?;
            output::print_discard(&report, json)
        }
        Command::Demo(args) => demo::demo(args, config),
        Command::Doctor(args) => {
            if doctor::doctor(args, config)? {
                Ok(())
            } else {
                std::process::exit(Exit::CheckFailed as u8 as i32)
            }
        }
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
        Command::Bench(args) => bench::bench(args, config),
        Command::AbiLayout => {
            print!("{}", cuda_abi::layout::report());
            Ok(())
        }
        Command::CarrierHelper(CarrierHelperArgs {
            socket,
            driver,
            idle,
        }) => carrier_helper(socket, driver, idle),
    }
}

/// `suspend`.
fn suspend(args: SuspendArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let SuspendArgs {
        pid,
        state_dir,
        freeze_timeout,
        driver,
        keep_contexts,
        carrier,
        json,
    } = args;
    let mut options = capture_options(pid, freeze_timeout, driver, config);
    options.state_dir = state_dir.unwrap_or(options.state_dir);
    if keep_contexts {
        options.mode = protocol::state::SuspendMode::KeepContexts;
    }
    carrier.apply(&mut options)?;
    let progress = progress::Bars::new(!json);
    let report = capture::suspend(&options, &progress)
        .with_context(|| format!("suspending the group under pid {pid}"))?;
    output::print_report("suspended", &report, json)
}

/// `prepare`.
fn prepare(args: PrepareArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let PrepareArgs {
        pid,
        driver,
        keep_contexts,
        json,
    } = args;
    let mut options = capture_options(pid, 30, driver, config);
    if keep_contexts {
        options.mode = protocol::state::SuspendMode::KeepContexts;
    }
    CarrierPlace::Auto.apply(&mut options)?;
    let report = capture::prepare(&options, config.pin_ahead_budget)
        .with_context(|| format!("preparing the carriers of the group under pid {pid}"))?;
    if json {
        output::print_json(&report)
    } else {
        output::print_prepare(&report);
        Ok(())
    }
}

/// `resume`.
fn resume(args: ResumeArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let ResumeArgs {
        pid,
        state_dir,
        allow_lost,
        driver,
        json,
    } = args;
    let mut options = ResumeOptions::new(pid, config);
    options.state_dir = state_dir.unwrap_or(options.state_dir);
    options.driver = driver;
    options.allow_lost = allow_lost;
    let progress = progress::Bars::new(!json);
    let report = capture::resume(&options, &progress)
        .with_context(|| format!("resuming the group under pid {pid}"))?;
    output::print_report("resumed", &report, json)
}

/// `checkpoint`.
fn checkpoint(args: CheckpointArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let CheckpointArgs {
        pid,
        container,
        dir,
        leave_running,
        self_contained,
        criu,
        freeze_timeout,
        driver,
        json,
    } = args;
    let pid = match container {
        Some(container) => control::runtimes::init_pid(&container)?,
        None => pid.ok_or_else(|| Usage("--pid or --container is required".into()))?,
    };
    let options = disk::CheckpointOptions {
        capture: capture_options(pid, freeze_timeout, driver, config),
        dir,
        leave_running,
        criu,
        self_contained,
    };
    let progress = progress::Bars::new(!json);
    let report = disk::checkpoint(&options, &progress)
        .with_context(|| format!("checkpointing the group under pid {pid}"))?;
    output::print_disk_report("checkpointed", &report, json)
}

/// `end`.
fn end(args: EndArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let EndArgs {
        pid,
        state_dir,
        json,
    } = args;
    let mut options = control::end::EndOptions::new(pid, config);
    options.state_dir = state_dir.unwrap_or(options.state_dir);
    let report =
        control::end::end(&options).with_context(|| format!("ending the group under pid {pid}"))?;
    output::print_end(pid, &report, json)
}

/// `restore` (without `--cleanup`).
fn restore(options: &disk::RestoreOptions, json: bool) -> anyhow::Result<()> {
    let progress = progress::Bars::new(!json);
    let report = disk::restore(options, &progress)
        .with_context(|| format!("restoring {}", options.dir.display()))?;
    output::print_disk_report("restored", &report, json)
}

/// `carrier-helper`: serves the carriers of a control directory until idle for `idle` seconds.
fn carrier_helper(socket: PathBuf, driver: Option<PathBuf>, idle: u64) -> anyhow::Result<()> {
    check_helper_socket(&socket)?;
    let library = driver.unwrap_or_else(|| PathBuf::from("libcuda.so.1"));
    let loaded = cuda::load(library.as_os_str(), cuda::Resolve::Dlsym)
        .with_context(|| format!("loading {}", library.display()))?;
    // The helper's own log (appended to cuinterpose-carrier.log by the tool that started it):
    // what it served and gave back.
    copy::log::set_max_level(copy::log::Level::Info as u8);
    let config = copy::carrier_helper::HelperConfig {
        socket,
        idle: Duration::from_secs(idle),
    };
    copy::carrier_helper::serve(loaded.table(), &config).context("the carrier helper stopped")
}

/// `inspect`: the group under `pid`, and the carrier a suspend would choose for it.
fn inspect(
    pid: u32,
    state_dir: Option<&std::path::Path>,
    driver: Option<&std::path::Path>,
    json: bool,
    config: &control::config::ToolConfig,
) -> anyhow::Result<()> {
    let mut report = control::group::inspect(pid, state_dir, config.answer_timeout)?;
    // Inspect shows the group whether or not the driver can be asked about the GPUs.
    report.carrier =
        control::carrier_choice::for_inspect(&report, driver, config.helper_context_bytes)
            .unwrap_or_else(|e| {
                eprintln!("cuinterpose: the carrier a suspend would choose is not known: {e}");
                None
            });
    if json {
        output::print_json(&report)
    } else {
        output::print_inspect(&report);
        Ok(())
    }
}

/// `carrier-helper --socket`: where a socket can be made (its directory exists; nothing but a
/// stale socket at the path, which the helper replaces), or a bad argument.
fn check_helper_socket(socket: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let bad = |why: String| Err(Usage(format!("--socket {}: {why}", socket.display())).into());
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => Ok(()),
        Ok(m) => bad(format!(
            "is {}, not a socket",
            control::safefs::describe(m.file_type())
        )),
        Err(_) => match socket.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(dir) if !dir.is_dir() => bad(format!("{} is not a directory", dir.display())),
            _ => Ok(()),
        },
    }
}

#[cfg(test)]
mod help_tests;

#[cfg(test)]
mod exit_tests {
    use super::*;

    /// Each class of the library's errors leaves by its documented code, found through the
    /// context the verbs add (`ending the group under pid 7: ...`).
    #[test]
    fn errors_leave_by_their_documented_exit_codes() {
        let exit = |e: ControlError| exit_for(&anyhow::Error::new(e).context("a verb"));
        assert_eq!(exit(ControlError::NoCudaProcesses(7)), Exit::Refused);
        let suspend = |e: SuspendError| {
            exit_for(&anyhow::Error::new(e).context("suspending the group under pid 7"))
        };
        assert_eq!(
            suspend(SuspendError::NotStarted(ControlError::AnotherRun {
                process: "pid 7".into(),
                message: "held".into(),
            })),
            Exit::Refused
        );
        // A participant gone before the freeze: nothing changed, but not a refusal (exit 1).
        assert_eq!(
            suspend(SuspendError::NotStarted(ControlError::Protocol {
                process: "pid 7".into(),
                message: "closed".into(),
            })),
            Exit::Error
        );
        assert_eq!(
            suspend(SuspendError::RolledBack {
                failure: Box::new(ControlError::NoSuchProcess(7)),
            }),
            Exit::RolledBack
        );
        // A drain past --freeze-timeout exits 4 as docs/recovery.md says, as the capture
        // reports it (inside its rollback) and alone.
        let not_drained = || ControlError::NotDrained {
            timeout: Duration::from_secs(2),
            busy: vec!["pid 7: a kernel that never ends".into()],
        };
        assert_eq!(exit(not_drained()), Exit::RolledBack);
        let drain_rolled_back = SuspendError::RolledBack {
            failure: Box::new(not_drained()),
        };
        assert_eq!(suspend(drain_rolled_back), Exit::RolledBack);
        let gate_stayed_closed = SuspendError::RollbackFailed {
            failure: Box::new(not_drained()),
            rollback: vec![ControlError::Protocol {
                process: "pid 7".into(),
                message: "thaw".into(),
            }],
        };
        assert_eq!(suspend(gate_stayed_closed), Exit::NeedsAttention);
        let resume = |e: ResumeError| {
            exit_for(&anyhow::Error::new(e).context("resuming the group under pid 7"))
        };
        assert_eq!(
            resume(ResumeError::NotStarted(ControlError::Unchanged {
                source: Box::new(ControlError::NoSuchProcess(7)),
            })),
            Exit::Refused
        );
        assert_eq!(
            resume(ResumeError::NotRebuilt(ControlError::VerifyFailed(
                Vec::new()
            ))),
            Exit::NeedsAttention
        );
        assert_eq!(
            resume(ResumeError::NotRebuilt(ControlError::Protocol {
                process: "pid 7".into(),
                message: "closed".into(),
            })),
            Exit::Error
        );
        assert_eq!(
            resume(ResumeError::StateNotRemoved(ControlError::Removing {
                path: "/s/cuinterpose.state".into(),
                source: std::io::Error::other("denied"),
            })),
            Exit::Error
        );
        assert_eq!(
            exit(ControlError::VerifyFailed(Vec::new())),
            Exit::NeedsAttention
        );
        assert_eq!(exit(ControlError::Panicked { step: "dump" }), Exit::Error);
        let locked = DiscardError::NothingRemoved(ControlError::AnotherRun {
            process: "checkpoint /c".into(),
            message: "held".into(),
        });
        assert_eq!(
            exit_for(&anyhow::Error::new(locked).context("discarding")),
            Exit::Refused
        );
        let alive = EndError::NotEnded {
            processes: vec!["pid 7".into()],
            waited: Duration::from_secs(30),
        };
        assert_eq!(
            exit_for(&anyhow::Error::new(alive).context("ending")),
            Exit::NeedsAttention
        );
        let restore = |e: RestoreError| exit_for(&anyhow::Error::new(e).context("restoring /c"));
        let failure = || {
            Box::new(ControlError::Protocol {
                process: "pid 7".into(),
                message: "closed".into(),
            })
        };
        assert_eq!(
            restore(RestoreError::NotRestored(ControlError::AnotherRun {
                process: "checkpoint /c".into(),
                message: "held".into(),
            })),
            Exit::Refused
        );
        assert_eq!(
            restore(RestoreError::CriuFailed {
                status: "exit status 1".into(),
                log: "/l".into(),
                tail: String::new(),
            }),
            Exit::RolledBack
        );
        assert_eq!(
            restore(RestoreError::Untracked(ControlError::Criu(
                control::criu::CriuError::NoPid("restore")
            ))),
            Exit::Error
        );
        assert_eq!(
            restore(RestoreError::Undone {
                root: 7,
                failure: failure(),
            }),
            Exit::RolledBack
        );
        assert_eq!(
            restore(RestoreError::NotUndone {
                root: 7,
                failure: failure(),
            }),
            Exit::NeedsAttention
        );
        let prepare = |e: PrepareError| {
            exit_for(
                &anyhow::Error::new(e).context("preparing the carriers of the group under pid 7"),
            )
        };
        assert_eq!(
            prepare(PrepareError::NotStarted(ControlError::CarrierRefused {
                carrier: "helper",
                reason: "no helper".into(),
            })),
            Exit::Refused
        );
        assert_eq!(
            prepare(PrepareError::Helper(ControlError::CarrierHelper {
                socket: "/run/c/carrier.sock".into(),
                message: "not listening".into(),
            })),
            Exit::Error
        );
        let checkpoint = |e: CheckpointError| {
            exit_for(&anyhow::Error::new(e).context("checkpointing the group under pid 7"))
        };
        assert_eq!(
            checkpoint(CheckpointError::NotStarted(ControlError::AnotherRun {
                process: "pid 7".into(),
                message: "held".into(),
            })),
            Exit::Refused
        );
        assert_eq!(
            checkpoint(CheckpointError::NotCaptured(SuspendError::RolledBack {
                failure: Box::new(not_drained()),
            })),
            Exit::RolledBack
        );
        assert_eq!(
            checkpoint(CheckpointError::NotCaptured(SuspendError::RollbackFailed {
                failure: Box::new(not_drained()),
                rollback: Vec::new(),
            })),
            Exit::NeedsAttention
        );
        assert_eq!(
            checkpoint(CheckpointError::Suspended(ControlError::Driver {
                call: "cuDeviceGetCount",
                result: cuda_abi::CUresult::ERROR_UNKNOWN,
            })),
            Exit::NeedsAttention
        );
        assert_eq!(
            checkpoint(CheckpointError::RolledBack { failure: failure() }),
            Exit::RolledBack
        );
        assert_eq!(
            checkpoint(CheckpointError::RollbackFailed {
                failure: failure(),
                rollback: failure(),
            }),
            Exit::NeedsAttention
        );
        assert_eq!(
            checkpoint(CheckpointError::Complete(ControlError::Step {
                step: "stopping the dumped tree (the checkpoint is complete)",
                process: "pid 7".into(),
                source: failure(),
            })),
            Exit::NeedsAttention
        );
        assert_eq!(
            exit_for(&anyhow::Error::new(Usage("--socket".into()))),
            Exit::Usage
        );
        assert_eq!(exit_for(&anyhow::anyhow!("other")), Exit::Error);
    }
}
