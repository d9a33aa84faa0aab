//! The ring of shared memory the demo and the bench build (rank `i` makes `a<i>` and shares it
//! with rank `(i + 1) % n`), the checks that it kept its contents and its sharing, and the process
//! tree of the runs through disk (`cuinterpose run --pid-namespace` of a workload tree).

use anyhow::{Context, bail, ensure};
use std::path::Path;
use std::process::Child;
use std::time::Duration;
use workload::launch::{Launcher, Workload};

/// How long a tree gets to start, and its launcher to exit after the dump.
pub(crate) const TREE_TIMEOUT: Duration = Duration::from_secs(120);

/// How the demo group's memory is made and shared (`--sharing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// cuMemCreate, exported as POSIX descriptors and imported by the next rank.
    Vmm,
    /// cuMemAlloc, opened by the next rank through legacy CUDA IPC.
    LegacyIpc,
    /// cuMemAlloc, used by its own rank only.
    Private,
    /// One multicast object, each rank binding a member on its own device; suspended and resumed
    /// in place. Only with --allow-multicast, and the workload's multicast commands run on the
    /// bundled fake driver only.
    Multicast,
}

impl Sharing {
    /// The environment the group's processes need: the shim owns `cuMemAlloc` memory for the
    /// modes built on it.
    pub(crate) fn env(self) -> Option<(&'static str, &'static str)> {
        match self {
            Sharing::Vmm | Sharing::Multicast => None,
            Sharing::LegacyIpc | Sharing::Private => Some(("CUINTERPOSE_ALLOC", "vmm")),
        }
    }

    /// The rank that reads and writes rank `creator`'s memory in a group of `n`.
    fn peer(self, creator: usize, n: usize) -> usize {
        match self {
            Sharing::Vmm | Sharing::LegacyIpc | Sharing::Multicast => (creator + 1) % n,
            Sharing::Private => creator,
        }
    }
}

/// The pattern rank `rank` fills its memory with in `round`.
pub fn seed(rank: usize, round: u64) -> u64 {
    1000 * round + rank as u64 + 1
}

/// Contents survived, and sharing is alive both ways: each importer sees the creator's bytes, then
/// writes new ones that the creator sees (for private memory the creator is its own reader).
pub fn verify_after(
    group: &[Workload],
    what: &str,
    sharing: Sharing,
) -> anyhow::Result<Vec<String>> {
    let n = group.len();
    let mut checks = Vec::new();
    for creator in 0..n {
        let importer = sharing.peer(creator, n);
        let region = format!("a{creator}");
        group[creator].assert_pattern(&region, seed(creator, 1))?;
        if importer == creator {
            checks.push(format!("{region}: contents kept in rank {creator}"));
        } else {
            group[importer].assert_pattern(&region, seed(creator, 1))?;
            checks.push(format!(
                "{region}: contents kept in creator rank {creator} and importer rank {importer}"
            ));
        }
        group[importer].ok(&format!("fill {region} {}", seed(creator, 2)))?;
        group[creator].assert_pattern(&region, seed(creator, 2))?;
        checks.push(if importer == creator {
            format!("{region}: rank {creator} reads back what it wrote after {what}")
        } else {
            format!("{region}: a write by rank {importer} after {what} is seen by rank {creator}")
        });
    }
    Ok(checks)
}

/// The group's launcher and, once restored, the restored tree: both ended when the demo ends.
#[derive(Debug)]
pub struct Launched {
    pub launcher: Child,
    pub restored: Option<u32>,
}

impl Drop for Launched {
    fn drop(&mut self) {
        let mut roots: Vec<u32> = self.restored.into_iter().collect();
        if matches!(self.launcher.try_wait(), Ok(None)) {
            // The launcher's child is the namespace's init: killing it ends the namespace.
            if let Some(&init) = control::discovery::process_tree(self.launcher.id())
                .ok()
                .and_then(|tree| tree.get(1).copied())
                .as_ref()
            {
                roots.push(init);
            }
        }
        for root in roots {
            if let Err(e) = control::launch::kill_tree(root, Duration::from_secs(30)) {
                eprintln!("cuinterpose demo: ending pid {root}: {e}");
            }
        }
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

/// `cuinterpose run --pid-namespace -- cuinterpose-workload tree --processes N ...`, every rank
/// on device 0; waits until rank 0 (which waits for the others) answers.
pub fn launch_tree(
    env: &Launcher,
    listen: &Path,
    processes: usize,
    sharing: Sharing,
) -> anyhow::Result<Launched> {
    let me = std::env::current_exe().context("finding this executable")?;
    let program = &env.programs().workload;
    ensure!(
        program.exists(),
        "{} is missing: build the workspace, or reinstall the release",
        program.display()
    );
    let log_path = env.log_dir().join("launcher.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    // The shim comes from `run` itself; stdio goes to files (CRIU restores no terminal).
    let mut command = env.command(&me, false)?;
    command.envs(sharing.env());
    command
        .arg("run")
        .arg("--pid-namespace")
        .arg("--")
        .arg(program)
        .arg("tree")
        .arg("--processes")
        .arg(processes.to_string())
        .arg("--devices")
        .arg("0")
        .arg("--listen-dir")
        .arg(listen)
        .stdout(log.try_clone()?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let launcher = command.spawn().context("starting the launcher")?;
    let mut launched = Launched {
        launcher,
        restored: None,
    };
    let ready = workload::wire::wait_listening(&listen.join("0.sock"), TREE_TIMEOUT, || {
        matches!(launched.launcher.try_wait(), Ok(None))
    });
    if let Err(e) = ready {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        bail!("the group did not start: {e}\n{log}");
    }
    Ok(launched)
}

/// Handles on the ranks of a tree listening in `listen` (the original or a restored one).
pub fn attach_ranks(listen: &Path, processes: usize) -> anyhow::Result<Vec<Workload>> {
    (0..processes)
        .map(|r| {
            Workload::attach(
                format!("rank{r}"),
                listen.join(format!("{r}.sock")),
                0,
                listen.join(format!("{r}.log")),
            )
            .with_context(|| format!("reaching rank {r}"))
        })
        .collect()
}

/// The group's memory: rank `i` makes `a<i>` and, unless it is private, shares it with rank
/// `(i + 1) % n`, which maps it as `a<i>` too.
pub fn ring(ranks: &[Workload], size: u64, sharing: Sharing) -> anyhow::Result<()> {
    match sharing {
        Sharing::Vmm => vmm_ring(ranks, size),
        Sharing::LegacyIpc => ipc_ring(ranks, size),
        Sharing::Private => {
            for (i, w) in ranks.iter().enumerate() {
                w.ok(&format!("malloc a{i} {size}"))?;
            }
            Ok(())
        }
        // Multicast groups are built by `Demo::multicast`, never around a ring.
        Sharing::Multicast => bail!("a multicast group is not built around a ring"),
    }
}

/// Legacy IPC around the ring: rank `i` allocates `a<i>` with `cuMemAlloc` and sends its
/// `cuIpcGetMemHandle` to rank `(i + 1) % n`, which opens it as region `a<i>`.
fn ipc_ring(ranks: &[Workload], size: u64) -> anyhow::Result<()> {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        w.all_ok(&[
            &format!("malloc a{i} {size}"),
            &format!("ipc-get h{i} a{i}"),
        ])?;
    }
    for (i, creator) in ranks.iter().enumerate() {
        let to = &ranks[(i + 1) % n];
        creator.ok(&format!("send-ipc h{i} --to {}", to.socket().display()))?;
        to.all_ok(&[
            &format!("wait ipc h{i}"),
            &format!("ipc-open a{i} --blob h{i}"),
        ])?;
    }
    Ok(())
}

/// VMM descriptors around the ring (as [`workload::launch::Group::ring`] on attached ranks): rank `i` creates `a<i>`
/// and shares it with rank `(i + 1) % n`, which imports and maps it.
fn vmm_ring(ranks: &[Workload], size: u64) -> anyhow::Result<()> {
    let n = ranks.len();
    for (i, w) in ranks.iter().enumerate() {
        w.all_ok(&[
            &format!("create a{i} {size} --handle-types posix"),
            &format!("reserve r-a{i} {size}"),
            &format!("map a{i} r-a{i}"),
            &format!("set-access a{i} --device {}", w.device()),
            &format!("export a{i}"),
        ])?;
    }
    for (i, creator) in ranks.iter().enumerate() {
        let to = (i + 1) % n;
        creator.ok(&format!("send-fd a{i} --to {to}"))?;
        let w = &ranks[to];
        w.all_ok(&[
            &format!("wait fd a{i}"),
            &format!("import a{i} --size {size}"),
            &format!("reserve r-a{i} {size}"),
            &format!("map a{i} r-a{i}"),
            &format!("set-access a{i} --device {}", w.device()),
        ])?;
    }
    Ok(())
}
