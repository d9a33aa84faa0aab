//! `cuinterpose-workload`: a scriptable CUDA workload for tests and the GPU lane.
//!
//! ```text
//! cuinterpose-workload serve --listen PATH [--device D] [--resolve dlsym|getprocaddress]
//!                            [--script FILE] [--library LIB] [--no-parent-watch]
//! cuinterpose-workload serve --script FILE ...          (no --listen: run the script and exit)
//! cuinterpose-workload tree --processes N --listen-dir DIR [--devices 0,1] [--resolve R]
//! cuinterpose-workload bench [--iterations N] [--tracked-iterations M] [--size S] [--device D]
//!                            [--cpu C] [--serve-rounds]
//! cuinterpose-workload client --socket PATH COMMAND...  (one command per argument)
//! cuinterpose-workload commands                         (the command grammar, one line each)
//! ```
//!
//! The command grammar is in `crates/workload/README.md`. Exit status: 0 after `exit` (or the code
//! it names), 1 when a script command fails, 2 on a start-up error, 0 when the parent went away.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use cuinterpose_workload::bench::{self, BenchOptions};
use cuinterpose_workload::driver::Resolve;
use cuinterpose_workload::server::{self, COMMANDS, ServeOptions, TreeOptions};
use cuinterpose_workload::wire;

#[derive(Parser)]
#[command(name = "cuinterpose-workload", about = "A scriptable CUDA workload")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve commands on a socket (after an optional script).
    Serve {
        /// The socket to listen on; without it, run --script and exit.
        #[arg(long)]
        listen: Option<PathBuf>,
        /// The device whose primary context is used.
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// How driver entry points are resolved: dlsym or getprocaddress.
        #[arg(long, default_value = "dlsym", value_parser = parse_resolve)]
        resolve: Resolve,
        /// Commands to run first, one per line.
        #[arg(long)]
        script: Option<PathBuf>,
        /// The driver library.
        #[arg(long, default_value = "libcuda.so.1")]
        library: PathBuf,
        /// This process's rank in a tree (reported by `info`).
        #[arg(long)]
        rank: Option<usize>,
        /// Directory of peers' `<rank>.sock`, so that `--to RANK` works.
        #[arg(long)]
        peer_dir: Option<PathBuf>,
        /// Keep running when the parent process exits.
        #[arg(long)]
        no_parent_watch: bool,
    },
    /// Start a process tree of N workloads (the root is rank 0) and serve as its root.
    Tree {
        /// Processes in the tree, root included.
        #[arg(long)]
        processes: usize,
        /// Rank r listens on DIR/<r>.sock; children log to DIR/<r>.log.
        #[arg(long)]
        listen_dir: PathBuf,
        /// Devices, assigned to ranks round-robin.
        #[arg(long, default_value = "0", value_delimiter = ',')]
        devices: Vec<i32>,
        /// How driver entry points are resolved (all ranks).
        #[arg(long, default_value = "dlsym", value_parser = parse_resolve)]
        resolve: Resolve,
        /// The driver library (all ranks).
        #[arg(long, default_value = "libcuda.so.1")]
        library: PathBuf,
        /// Keep the root running when its parent exits.
        #[arg(long)]
        no_parent_watch: bool,
    },
    /// The overhead benchmark: one warm-up round, then one reported round as a JSON object (or,
    /// with --serve-rounds, one per `round` line on stdin).
    Bench {
        /// Iterations of each untracked loop per round.
        #[arg(long, default_value_t = 100_000)]
        iterations: u64,
        /// Iterations of the tracked create/map/set-access/unmap/release cycle per round.
        #[arg(long, default_value_t = 2_000)]
        tracked_iterations: u64,
        /// Bytes per tracked allocation (rounded up to the granularity).
        #[arg(long, default_value_t = 0)]
        size: u64,
        /// The device.
        #[arg(long, default_value_t = 0)]
        device: i32,
        /// How driver entry points are resolved.
        #[arg(long, default_value = "dlsym", value_parser = parse_resolve)]
        resolve: Resolve,
        /// The driver library.
        #[arg(long, default_value = "libcuda.so.1")]
        library: PathBuf,
        /// Pin the measuring thread to this CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Print `ready` once warmed up, then answer each `round` line on stdin with one JSON
        /// line, until `exit` or the end of stdin.
        #[arg(long)]
        serve_rounds: bool,
        /// Run the launch-bound loop instead: this many threads, each issuing --iterations noop
        /// kernel launches and 4 KiB asynchronous copies on a stream of its own, per round.
        #[arg(long)]
        launch_threads: Option<usize>,
    },
    /// Send commands to a workload and print its replies; fails if one fails.
    Client {
        /// The workload's socket.
        #[arg(long)]
        socket: PathBuf,
        /// Seconds to wait for each reply.
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Commands, one per argument (quote each).
        #[arg(required = true)]
        commands: Vec<String>,
    },
    /// Print the command grammar.
    Commands,
}

fn parse_resolve(s: &str) -> Result<Resolve, String> {
    Resolve::parse(s).ok_or_else(|| format!("unknown route {s:?} (dlsym or getprocaddress)"))
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(code) => std::process::ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("cuinterpose-workload: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<i32> {
    match Cli::parse().command {
        Cmd::Serve {
            listen,
            device,
            resolve,
            script,
            library,
            rank,
            peer_dir,
            no_parent_watch,
        } => {
            if listen.is_none() && script.is_none() {
                bail!("serve needs --listen or --script");
            }
            let options = ServeOptions {
                listen,
                device,
                resolve,
                library,
                script,
                rank,
                peer_dir,
                parent_watch: !no_parent_watch,
            };
            Ok(server::serve(options)?)
        }
        Cmd::Tree {
            processes,
            listen_dir,
            devices,
            resolve,
            library,
            no_parent_watch,
        } => {
            if processes == 0 {
                bail!("a tree needs at least one process");
            }
            Ok(server::tree(TreeOptions {
                processes,
                listen_dir,
                devices,
                resolve,
                library,
                parent_watch: !no_parent_watch,
            })?)
        }
        Cmd::Bench {
            iterations,
            tracked_iterations,
            size,
            device,
            resolve,
            library,
            cpu,
            serve_rounds,
            launch_threads,
        } => {
            let options = BenchOptions {
                device,
                resolve,
                library,
                untracked_iterations: iterations,
                tracked_iterations,
                size,
                cpu,
                launch_threads,
            };
            if serve_rounds {
                bench::serve_rounds(&options, std::io::stdin().lock(), std::io::stdout().lock())?;
            } else {
                println!("{}", bench::run(&options)?);
            }
            Ok(0)
        }
        Cmd::Client {
            socket,
            timeout,
            commands,
        } => {
            let lines: Vec<&str> = commands.iter().map(String::as_str).collect();
            let replies = wire::call(&socket, &lines, None, Duration::from_secs(timeout))
                .with_context(|| format!("talking to {}", socket.display()))?;
            let mut failed = false;
            for r in &replies {
                println!("{}", r.to_line());
                failed |= !r.ok;
            }
            Ok(i32::from(failed))
        }
        Cmd::Commands => {
            for (_, synopsis) in COMMANDS {
                println!("{synopsis}");
            }
            Ok(0)
        }
    }
}
