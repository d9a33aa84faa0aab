//! The workload process: a command thread that owns the CUDA context and executes commands, a
//! listener that accepts one connection per command or batch, and the process-tree mode.
//!
//! Threads:
//! - the **command thread** (the main thread) initialises the driver, retains the primary context
//!   of `--device` and makes it current, then executes every command in arrival order;
//! - the **listener** accepts connections and starts one short-lived thread per connection, which
//!   reads command lines, hands them to the command thread and writes the replies. `recv-fd` and
//!   `recv-ipc` (what peers send) are stored by the connection thread itself, so a peer can hand
//!   over a descriptor while the command thread is busy (or is itself sending one to that peer);
//! - the **watch** thread exits the process when its parent goes away (no orphans) and reaps the
//!   children of a tree root.

mod exec;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::driver::{CuError, Driver, LoadError, Resolve};
use crate::grammar::{self, Args, command_word, significant};
use crate::reply::{Reply, kind};
use crate::wire::{self, LineReader};

pub use exec::COMMANDS;

/// How long a connection may sit idle between lines before the workload closes it.
const CONNECTION_IDLE: Duration = Duration::from_secs(60);

/// How long a tree root waits for its children to listen.
const CHILD_READY: Duration = Duration::from_secs(180);

/// Why a workload could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The driver could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Initialisation failed.
    #[error("driver initialisation failed: {0}")]
    Init(#[from] CuError),
    /// A socket, file or child process could not be set up.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// A child of the tree did not come up.
    #[error("tree rank {rank} did not start: {message}")]
    Child {
        /// The rank.
        rank: usize,
        /// Why.
        message: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ServeError {
    let what = what.into();
    move |source| ServeError::Io { what, source }
}

/// What `serve` runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The socket to listen on; without it the workload runs its script and exits.
    pub listen: Option<PathBuf>,
    /// The device whose primary context the command thread uses.
    pub device: i32,
    /// How driver entry points are resolved.
    pub resolve: Resolve,
    /// The driver library (`libcuda.so.1`, found by the loader).
    pub library: PathBuf,
    /// Commands to run before serving.
    pub script: Option<PathBuf>,
    /// The rank in a tree, reported by `info`.
    pub rank: Option<usize>,
    /// Where peers listen as `<rank>.sock`, so `--to 3` names rank 3.
    pub peer_dir: Option<PathBuf>,
    /// Exit when the parent process goes away.
    pub parent_watch: bool,
}

impl ServeOptions {
    /// Options for a workload listening on `listen`, everything else default.
    pub fn listening(listen: PathBuf) -> ServeOptions {
        ServeOptions {
            listen: Some(listen),
            device: 0,
            resolve: Resolve::Dlsym,
            library: PathBuf::from("libcuda.so.1"),
            script: None,
            rank: None,
            peer_dir: None,
            parent_watch: true,
        }
    }
}

/// What `tree` runs.
#[derive(Debug, Clone)]
pub struct TreeOptions {
    /// Processes in the tree, root included.
    pub processes: usize,
    /// Rank `r` listens on `<dir>/<r>.sock` and its stdout and stderr go to `<dir>/<r>.log`
    /// (the root's go wherever the root's go).
    pub listen_dir: PathBuf,
    /// Rank `r` uses device `devices[r % len]`.
    pub devices: Vec<i32>,
    /// How driver entry points are resolved (all ranks).
    pub resolve: Resolve,
    /// The driver library (all ranks).
    pub library: PathBuf,
    /// Whether the root exits when its parent goes away (children always do).
    pub parent_watch: bool,
}

/// Descriptors and byte blobs received from peers or produced by exports, by name.
#[derive(Debug, Default)]
pub struct Inbox {
    /// Descriptors (exported allocations, received ones, opened files).
    pub fds: BTreeMap<String, OwnedFd>,
    /// Byte blobs (legacy IPC handles, fabric handles).
    pub blobs: BTreeMap<String, Vec<u8>>,
}

/// State shared by the command thread and the connection threads.
#[derive(Debug, Default)]
pub struct Shared {
    inbox: Mutex<Inbox>,
    arrived: Condvar,
}

impl Shared {
    /// The inbox, locked. A poisoned lock is still usable: the inbox holds no invariants across
    /// entries.
    pub fn inbox(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ready(inbox)` or the deadline; returns whether it became ready.
    pub fn wait_for(&self, deadline: Instant, ready: impl Fn(&Inbox) -> bool) -> bool {
        let mut guard = self.inbox();
        loop {
            if ready(&guard) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            guard = self
                .arrived
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn notify(&self) {
        self.arrived.notify_all();
    }

    fn receive_fd(&self, line: &str, fd: Option<OwnedFd>) -> Reply {
        let args = match Args::parse(line, &[]) {
            Ok(a) => a,
            Err(e) => return Reply::fail("recv-fd", kind::USAGE, e.0),
        };
        let name = match args
            .pos(0, "name")
            .and_then(|n| args.check(1, &[]).map(|()| n))
        {
            Ok(n) => n.to_owned(),
            Err(e) => return Reply::fail("recv-fd", kind::USAGE, e.0),
        };
        let Some(fd) = fd else {
            return Reply::fail("recv-fd", kind::IO, "no descriptor arrived with recv-fd");
        };
        let replaced = self.inbox().fds.insert(name.clone(), fd).is_some();
        self.notify();
        Reply::ok("recv-fd")
            .with("name", name)
            .with("replaced", replaced)
    }

    fn receive_blob(&self, line: &str) -> Reply {
        let parsed = Args::parse(line, &[]).and_then(|a| {
            a.check(2, &[])?;
            let name = a.pos(0, "name")?.to_owned();
            let bytes = grammar::from_hex(a.pos(1, "hex bytes")?)?;
            Ok((name, bytes))
        });
        match parsed {
            Ok((name, bytes)) => {
                let replaced = self.inbox().blobs.insert(name.clone(), bytes).is_some();
                self.notify();
                Reply::ok("recv-ipc")
                    .with("name", name)
                    .with("replaced", replaced)
            }
            Err(e) => Reply::fail("recv-ipc", kind::USAGE, e.0),
        }
    }
}

/// What ends the process: the socket file to remove and the children to stop.
#[derive(Debug, Default)]
struct Lifecycle {
    socket: Mutex<Option<PathBuf>>,
    children: Mutex<Vec<Child>>,
}

/// Set by the first thread that starts leaving the process; `exit` is not safe to call from two
/// threads at once.
static EXITING: AtomicBool = AtomicBool::new(false);

impl Lifecycle {
    fn exit(&self, code: i32) -> ! {
        if EXITING.swap(true, Ordering::AcqRel) {
            // Another thread is already cleaning up and will end the process.
            loop {
                std::thread::park();
            }
        }
        if let Some(path) = self.socket.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = std::fs::remove_file(path);
        }
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        stop_children(&mut children);
        let _ = io::stdout().flush();
        let _ = io::stderr().flush();
        std::process::exit(code)
    }
}

/// SIGTERM to every child still running, then SIGKILL to any that is left after a grace period.
fn stop_children(children: &mut Vec<Child>) {
    for child in children.iter() {
        if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for child in children.iter_mut() {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    children.clear();
}

/// A command for the command thread.
struct Job {
    line: String,
    done: Sender<Done>,
}

/// The command thread's answer: the reply and, for `exit`, a channel on which the connection
/// thread says the reply is written.
struct Done {
    reply: Reply,
    exit_ack: Option<Sender<()>>,
}

/// Runs a workload until `exit` (or until its parent goes away). Returns the exit status of a
/// script-only run; a serving workload leaves through [`std::process::exit`].
pub fn serve(options: ServeOptions) -> Result<i32, ServeError> {
    serve_with_children(options, Vec::new())
}

/// Serves with `children` (a tree root's) stopped on every way out, start-up failures included.
fn serve_with_children(options: ServeOptions, children: Vec<Child>) -> Result<i32, ServeError> {
    let lifecycle = Arc::new(Lifecycle {
        socket: Mutex::new(None),
        children: Mutex::new(children),
    });
    let result = serve_in(options, &lifecycle);
    stop_children(&mut lifecycle.children.lock().unwrap_or_else(|e| e.into_inner()));
    result
}

fn serve_in(options: ServeOptions, lifecycle: &Arc<Lifecycle>) -> Result<i32, ServeError> {
    let driver = Driver::load(&options.library, options.resolve)?;
    driver.init()?;
    let device = driver.device(options.device)?;
    driver.use_primary_context(device)?;
    start_watch(lifecycle, options.parent_watch)?;

    let shared = Arc::new(Shared::default());
    let (jobs, queue) = mpsc::channel::<Job>();
    if let Some(path) = &options.listen {
        let listener = bind(path)?;
        *lifecycle.socket.lock().unwrap_or_else(|e| e.into_inner()) = Some(path.clone());
        let shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("listener".into())
            .spawn(move || accept_loop(listener, jobs, shared))
            .map_err(io_err("cannot start the listener thread"))?;
    } else {
        drop(jobs);
    }

    let mut exec = exec::Exec::new(&driver, options.device, &shared, &options);
    if let Some(script) = &options.script {
        let text = std::fs::read_to_string(script)
            .map_err(io_err(format!("cannot read script {}", script.display())))?;
        for line in text.lines() {
            let Some(line) = significant(line) else {
                continue;
            };
            let step = exec.run(line);
            println!("{}", step.reply.to_line());
            if let Some(code) = step.exit {
                lifecycle.exit(code);
            }
            if !step.reply.ok {
                eprintln!("script command failed: {line}");
                lifecycle.exit(1);
            }
        }
        let _ = io::stdout().flush();
    }
    if options.listen.is_none() {
        return Ok(0);
    }
    command_loop(&mut exec, &queue, lifecycle)
}

fn command_loop(
    exec: &mut exec::Exec<'_>,
    queue: &Receiver<Job>,
    lifecycle: &Lifecycle,
) -> Result<i32, ServeError> {
    while let Ok(job) = queue.recv() {
        let step = exec.run(&job.line);
        match step.exit {
            None => {
                let _ = job.done.send(Done {
                    reply: step.reply,
                    exit_ack: None,
                });
            }
            Some(code) => {
                let (ack, acked) = mpsc::channel();
                let _ = job.done.send(Done {
                    reply: step.reply,
                    exit_ack: Some(ack),
                });
                let _ = acked.recv_timeout(Duration::from_secs(5));
                lifecycle.exit(code);
            }
        }
    }
    // The listener never drops its sender while the process serves.
    Ok(0)
}

/// Binds `path`, reclaiming a stale socket file only when nothing answers on it.
fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    match UnixListener::bind(path) {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Err(ServeError::Io {
                    what: format!("{} is in use by a live workload", path.display()),
                    source: e,
                });
            }
            std::fs::remove_file(path).map_err(io_err(format!(
                "cannot remove stale socket {}",
                path.display()
            )))?;
            UnixListener::bind(path).map_err(io_err(format!("cannot bind {}", path.display())))
        }
        Err(e) => Err(ServeError::Io {
            what: format!("cannot bind {}", path.display()),
            source: e,
        }),
    }
}

fn accept_loop(listener: UnixListener, jobs: Sender<Job>, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of descriptors or interrupted: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let jobs = jobs.clone();
        let shared = Arc::clone(&shared);
        // A connection thread that cannot start leaves the client to time out; the listener goes on.
        let _ = std::thread::Builder::new()
            .name("connection".into())
            .spawn(move || handle_connection(stream, jobs, shared));
    }
}

fn handle_connection(stream: UnixStream, jobs: Sender<Job>, shared: Arc<Shared>) {
    let _ = stream.set_read_timeout(Some(CONNECTION_IDLE));
    let _ = stream.set_write_timeout(Some(CONNECTION_IDLE));
    let mut reader = LineReader::new(&stream);
    loop {
        let line = match reader.next_line() {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(e) => {
                let _ = write_reply(&stream, &Reply::fail("?", kind::IO, e.to_string()));
                break;
            }
        };
        let Some(line) = significant(&line) else {
            continue;
        };
        let (reply, exit_ack) = match command_word(line) {
            Some("recv-fd") => (shared.receive_fd(line, reader.take_fd()), None),
            Some("recv-ipc") => (shared.receive_blob(line), None),
            _ => {
                let (done, answer) = mpsc::channel();
                let sent = jobs.send(Job {
                    line: line.to_owned(),
                    done,
                });
                match sent.ok().and_then(|()| answer.recv().ok()) {
                    Some(d) => (d.reply, d.exit_ack),
                    None => (
                        Reply::fail(
                            command_word(line).unwrap_or("?"),
                            kind::IO,
                            "the command thread is gone",
                        ),
                        None,
                    ),
                }
            }
        };
        let written = write_reply(&stream, &reply);
        if let Some(ack) = exit_ack {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = ack.send(());
            return;
        }
        if written.is_err() {
            break;
        }
    }
}

fn write_reply(mut stream: &UnixStream, reply: &Reply) -> io::Result<()> {
    let mut line = reply.to_line();
    line.push('\n');
    stream.write_all(line.as_bytes())
}

/// Starts the thread that exits the process when its parent goes away and reaps dead children.
/// A process whose parent is outside its PID namespace sees parent 0 and cannot tell; it relies on
/// whoever started the namespace.
fn start_watch(lifecycle: &Arc<Lifecycle>, parent_watch: bool) -> Result<(), ServeError> {
    let parent = rustix::process::getppid();
    let lifecycle = Arc::clone(lifecycle);
    std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(200));
                if parent_watch && parent.is_some() && rustix::process::getppid() != parent {
                    eprintln!("parent process exited; exiting");
                    lifecycle.exit(0);
                }
                let mut children = lifecycle.children.lock().unwrap_or_else(|e| e.into_inner());
                children.retain_mut(|c| match c.try_wait() {
                    Ok(Some(status)) => {
                        eprintln!("tree child {} exited: {status}", c.id());
                        false
                    }
                    _ => true,
                });
            }
        })
        .map(|_| ())
        .map_err(io_err("cannot start the watch thread"))
}

/// Runs a process tree: the root starts `processes - 1` children by executing itself (before the
/// driver is loaded), waits until each listens, then serves as rank 0.
pub fn tree(options: TreeOptions) -> Result<i32, ServeError> {
    std::fs::create_dir_all(&options.listen_dir).map_err(io_err(format!(
        "cannot create {}",
        options.listen_dir.display()
    )))?;
    let exe = std::env::current_exe().map_err(io_err("cannot find my own executable"))?;
    let device_of = |rank: usize| -> i32 {
        options
            .devices
            .get(rank % options.devices.len().max(1))
            .copied()
            .unwrap_or(0)
    };
    let mut children: Vec<Child> = Vec::new();
    let started = (|| {
        for rank in 1..options.processes.max(1) {
            let log_path = options.listen_dir.join(format!("{rank}.log"));
            let log = File::create(&log_path)
                .map_err(io_err(format!("cannot create {}", log_path.display())))?;
            let log2 = log
                .try_clone()
                .map_err(io_err("cannot duplicate a log descriptor"))?;
            let child = Command::new(&exe)
                .arg("serve")
                .arg("--listen")
                .arg(options.listen_dir.join(format!("{rank}.sock")))
                .arg("--rank")
                .arg(rank.to_string())
                .arg("--peer-dir")
                .arg(&options.listen_dir)
                .arg("--device")
                .arg(device_of(rank).to_string())
                .arg("--resolve")
                .arg(options.resolve.as_str())
                .arg("--library")
                .arg(&options.library)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .map_err(io_err(format!("cannot start rank {rank}")))?;
            children.push(child);
        }
        for (i, child) in children.iter_mut().enumerate() {
            let rank = i + 1;
            let path = options.listen_dir.join(format!("{rank}.sock"));
            wire::wait_listening(&path, CHILD_READY, || matches!(child.try_wait(), Ok(None)))
                .map_err(|e| ServeError::Child {
                    rank,
                    message: e.to_string(),
                })?;
        }
        Ok::<(), ServeError>(())
    })();
    if let Err(e) = started {
        stop_children(&mut children);
        return Err(e);
    }
    let root = ServeOptions {
        listen: Some(options.listen_dir.join("0.sock")),
        device: device_of(0),
        resolve: options.resolve,
        library: options.library.clone(),
        script: None,
        rank: Some(0),
        peer_dir: Some(options.listen_dir.clone()),
        parent_watch: options.parent_watch,
    };
    serve_with_children(root, children)
}
