//! The CRD and the node agent against real Kubernetes server code: the Kubernetes CRD API server
//! (k8s.io/apiextensions-apiserver 1.36 from Debian's source, on etcd 3.5, started by
//! scripts/k8s-test-server.sh) serves the Checkpoint CRD generated from the Rust types, and the
//! agent's kube-runtime controller drives real checkpoints of a workload on the fake driver with
//! the real CRIU.
//!
//! What has no real counterpart here: Pods as API objects and the kubelet (that server serves no
//! core API, and no kubelet can run on these machines). The agent reads the pod's metadata (name,
//! UID, labels, container IDs) through its `PodLookup` seam from a fixed list; the processes are
//! real either way:
//! - in the CRI test, pods made through containerd's CRI as a kubelet makes them
//!   (testkit::cri::Pod: sandbox, pause container, kubelet cgroup layout in every hierarchy);
//! - in the others, a "pod" is a process tree in a kubelet-style cgroup path
//!   (`.../kubepods/besteffort/pod<uid>/<container id>` in the cgroup v2 hierarchy), started as a
//!   container would be (the root of its own PID namespace, with the shim preloaded by the
//!   launcher, in network, IPC and UTS namespaces of the pod's own as a sandbox gives them): the
//!   refusals and the `run --pid-namespace` shape, which need no runtime.
//!
//! Events go to events.k8s.io/v1 through the real server too: a CRD of that name stands in for the
//! built-in resource.
//!
//! Ignored by default; scripts/test.sh runs it with `--ignored`, CUINTERPOSE_KUBE_TEST_KUBECONFIG
//! pointing at the server and CUINTERPOSE_TEST_CONTAINERD at containerd's socket. Needs root (CRIU,
//! cgroups).

use cuinterpose_kube::agent::tool::ToolOptions;
use cuinterpose_kube::agent::{self, PodContainer, PodInfo, PodLookup};
use cuinterpose_kube::crd::{Checkpoint, FINALIZER, condition};
use cuinterpose_kube::shaping::{OPT_IN_LABEL, RESTORE_LABEL};
use futures::future::BoxFuture;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::container::root_of;
use testkit::cri;
use testkit::harness::{Artifacts, DriverKind, TestEnv, Workload};

const NODE: &str = "node-a";
/// A namespace of this run's own (the server keeps what earlier runs left).
fn namespace() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("test-{}", std::process::id()))
}
const WAIT: Duration = Duration::from_secs(180);
const SIZE: u64 = 2 << 20;

async fn client() -> Client {
    let path = std::env::var_os("CUINTERPOSE_KUBE_TEST_KUBECONFIG")
        .expect("CUINTERPOSE_KUBE_TEST_KUBECONFIG (scripts/k8s-test-server.sh start)");
    let kubeconfig = Kubeconfig::read_from(&path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("client configuration");
    Client::try_from(config).expect("client")
}

/// The pods the agent sees (there is no Pod API on this server).
#[derive(Default)]
struct Pods(Mutex<Vec<PodInfo>>);

impl Pods {
    fn add(&self, pod: PodInfo) {
        self.0.lock().unwrap().push(pod);
    }
}

impl PodLookup for Pods {
    fn get<'a>(
        &'a self,
        _: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<PodInfo>, kube::Error>> {
        let found = self
            .0
            .lock()
            .unwrap()
            .iter()
            .find(|p| p.name == name)
            .cloned();
        Box::pin(async move { Ok(found) })
    }

    fn placeholders<'a>(
        &'a self,
        _: &'a str,
        checkpoint: &'a str,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, kube::Error>> {
        let found = (self.0.lock().unwrap().iter())
            .filter(|p| p.labels.get(RESTORE_LABEL).map(String::as_str) == Some(checkpoint))
            .filter(|p| p.node_name.as_deref() == Some(node))
            .cloned()
            .collect();
        Box::pin(async move { Ok(found) })
    }
}

/// A placeholder pod opted in and labelled to restore `checkpoint`, with one container.
fn placeholder_pod(name: &str, (uid, container_id): (&str, &str), checkpoint: &str) -> PodInfo {
    pod(
        name,
        uid,
        container_id,
        &[(OPT_IN_LABEL, "true"), (RESTORE_LABEL, checkpoint)],
        true,
    )
}

fn pod(
    name: &str,
    uid: &str,
    container_id: &str,
    labels: &[(&str, &str)],
    shaped: bool,
) -> PodInfo {
    PodInfo {
        name: name.into(),
        uid: uid.into(),
        node_name: Some(NODE.into()),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        annotations: BTreeMap::new(),
        containers: vec![PodContainer {
            name: "main".into(),
            shaped,
            id: Some(container_id.into()),
        }],
    }
}

/// A kubelet-style cgroup for one container of one pod, under a private test root in the cgroup
/// v2 hierarchy; removed (with any process still in it killed) at the end.
struct PodCgroup {
    dir: PathBuf,
    root: PathBuf,
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` or, on a hybrid host,
/// `/sys/fs/cgroup/unified`).
fn cgroup2_mount() -> PathBuf {
    let table = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    table
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            (right.split_whitespace().next()? == "cgroup2")
                .then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .expect("a cgroup v2 hierarchy (the test needs one, writable as root)")
}

impl PodCgroup {
    fn new(test_root: &Path, uid: &str, container_id: &str) -> PodCgroup {
        let dir = test_root
            .join("kubepods/besteffort")
            .join(format!("pod{uid}"))
            .join(container_id);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        PodCgroup {
            dir,
            root: test_root.to_path_buf(),
        }
    }

    /// Whether a process of the container runs `program` (its `comm`).
    fn runs(&self, program: &str) -> bool {
        self.pids().iter().any(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == program)
        })
    }

    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect()
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = control::launch::kill_tree(pid, Duration::from_secs(10));
        }
        // Deepest first.
        let mut dirs = vec![self.dir.clone()];
        let mut d = self.dir.clone();
        while let Some(parent) = d.parent() {
            if !parent.starts_with(&self.root) {
                break;
            }
            dirs.push(parent.to_path_buf());
            d = parent.to_path_buf();
        }
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

struct Test {
    env: TestEnv,
    tool: PathBuf,
    criu: PathBuf,
    cgroups: PathBuf,
}

impl Test {
    fn new() -> Test {
        let artifacts = Artifacts::locate().expect("artifacts (build the workspace first)");
        let tool = artifacts.dir().join("cuinterpose");
        assert!(
            tool.is_file(),
            "{} is missing: build the workspace first",
            tool.display()
        );
        let criu = std::env::var_os("CUINTERPOSE_CRIU")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.criu/bin/criu"));
        assert!(
            criu.is_file(),
            "CRIU not found at {}: run scripts/install-criu.sh",
            criu.display()
        );
        let env = TestEnv::new(artifacts, DriverKind::Fake, false).expect("test environment");
        let cgroups = cgroup2_mount().join(format!("cuinterpose-kube-test-{}", std::process::id()));
        Test {
            env,
            tool,
            criu,
            cgroups,
        }
    }

    /// A command in the test environment whose fake-driver state is the one the agent (this
    /// process) sees too.
    fn command(&self, program: &Path) -> std::process::Command {
        let mut command = self.env.command(program, false).expect("command");
        match std::env::var_os("FAKE_CUDA_STATE_DIR") {
            Some(dir) => command.env("FAKE_CUDA_STATE_DIR", dir),
            None => command.env_remove("FAKE_CUDA_STATE_DIR"),
        };
        command
    }

    /// Starts `program args` as a container of a pod would run: inside the container's cgroup
    /// from its first instruction, in network, IPC and UTS namespaces of the pod's own (the
    /// sandbox's, which the kubelet makes before the containers).
    fn start_in(&self, cgroup: &PodCgroup, program: &Path, args: &[&str], log: &str) -> Child {
        let log = std::fs::File::create(self.env.log_dir().join(format!("{log}.log"))).unwrap();
        let mut command = self.command(Path::new("/bin/sh"));
        command
            .arg("-c")
            .arg("echo $$ > \"$0\" && exec unshare --net --ipc --uts -- \"$@\"")
            .arg(cgroup.dir.join("cgroup.procs"))
            .arg(program)
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.spawn().expect("starting a container process")
    }

    /// The workload: `cuinterpose run --pid-namespace -- cuinterpose-workload tree` with two ranks,
    /// each holding a filled allocation.
    fn start_workload(&self, cgroup: &PodCgroup) -> (Child, PathBuf) {
        let listen = self.env.socket_dir().join("w");
        let workload = self.env.artifacts().workload().expect("workload binary");
        let listen_arg = listen.display().to_string();
        let args = [
            "run",
            "--pid-namespace",
            "--",
            workload.to_str().unwrap(),
            "tree",
            "--processes",
            "2",
            "--devices",
            "0,1",
            "--listen-dir",
            &listen_arg,
        ];
        let mut launcher = self.start_in(cgroup, &self.tool, &args, "w");
        self.fill_ranks(&listen, || matches!(launcher.try_wait(), Ok(None)));
        (launcher, listen)
    }

    /// Waits for the two ranks listening in `listen` (while `alive` says their starter runs) and
    /// fills each one's allocation.
    fn fill_ranks(&self, listen: &Path, mut alive: impl FnMut() -> bool) {
        // Each rank listens on its own socket, in no fixed order.
        for rank in ["0.sock", "1.sock"] {
            testkit::wire::wait_listening(&listen.join(rank), WAIT, &mut alive)
                .unwrap_or_else(|e| panic!("the workload did not start: {e}"));
        }
        for (r, w) in self.ranks(listen).iter().enumerate() {
            w.all_ok(&[
                &format!("create a{r} {SIZE} --handle-types posix"),
                &format!("reserve r-a{r} {SIZE}"),
                &format!("map a{r} r-a{r}"),
                &format!("set-access a{r} --device {r}"),
                &format!("fill a{r} {}", 100 + r),
            ])
            .expect("filling the ranks' memory");
        }
    }

    /// A pod of one container running `command`, made through containerd's CRI at `socket`
    /// (testkit::cri::Pod), with the environment a command of this test has (the fake driver's
    /// state shared with the agent, this process), the build's artifacts, the test's directory
    /// and the fake driver's state directory bound in.
    async fn cri_pod(&self, socket: &Path, name: &str, uid: &str, command: &[String]) -> cri::Pod {
        let probe = self.command(Path::new("/bin/true"));
        let mut envs: BTreeMap<String, String> = std::env::vars().collect();
        for (key, value) in probe.get_envs() {
            let key = key.to_string_lossy().into_owned();
            match value {
                Some(value) => envs.insert(key, value.to_string_lossy().into_owned()),
                None => envs.remove(&key),
            };
        }
        // The fake driver's own default when the variable is unset (fake-cuda's config).
        let fake_state = std::env::var_os("FAKE_CUDA_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(format!(
                    "/tmp/fake-cuda-{}",
                    rustix::process::getuid().as_raw()
                ))
            });
        std::fs::create_dir_all(&fake_state).expect("the fake driver's state directory");
        let log_dir = self.env.log_dir().join(name);
        std::fs::create_dir_all(&log_dir).expect("the pod's log directory");
        let image = std::env::var("CUINTERPOSE_TEST_PODMAN_IMAGE")
            .unwrap_or_else(|_| "localhost/cuinterpose-test-base:1".into());
        let spec = cri::PodSpec {
            name,
            uid,
            image: &image,
            command: command.to_vec(),
            envs: envs.into_iter().collect(),
            binds: &[self.env.artifacts().dir(), self.env.dir(), &fake_state],
            log_dir: &log_dir,
        };
        cri::Pod::run(socket, spec)
            .await
            .unwrap_or_else(|e| panic!("pod {name} through the CRI: {e}"))
    }

    /// The agent's controller for node [`NODE`], finding pods in `pods`.
    fn start_agent(&self, client: &Client, pods: &Arc<Pods>) -> tokio::task::JoinHandle<()> {
        let tool = ToolOptions {
            criu: Some(self.criu.clone()),
            driver: Some(self.env.artifacts().fake_driver().expect("fake driver")),
            freeze_timeout: Duration::from_secs(30),
            config: control::config::ToolConfig::default(),
        };
        let context = Arc::new(agent::Context::new(
            client.clone(),
            NODE.into(),
            pods.clone(),
            tool,
        ));
        tokio::spawn(agent::run(context))
    }

    fn ranks(&self, listen: &Path) -> Vec<Workload> {
        (0..2)
            .map(|r| {
                Workload::attach(
                    format!("rank{r}"),
                    listen.join(format!("{r}.sock")),
                    r,
                    listen.join(format!("{r}.log")),
                )
                .expect("attaching to a rank")
            })
            .collect()
    }
}

async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    // events.k8s.io is built into a kube-apiserver; on the CRD server a CRD of the same group,
    // version and resource serves it, so that the agent's Event recorder talks to real storage.
    let events: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "events.events.k8s.io",
                     "annotations": {"api-approved.kubernetes.io": "unapproved, test stand-in for the built-in Events API"}},
        "spec": {"group": "events.k8s.io", "scope": "Namespaced",
                 "names": {"plural": "events", "singular": "event", "kind": "Event", "listKind": "EventList"},
                 "versions": [{"name": "v1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    for crd in [Checkpoint::crd(), events] {
        let name = crd.name_any();
        match crds.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("creating CRD {name}: {e}"),
        }
        wait_for(&format!("CRD {name} established"), || async {
            let crd = crds.get(&name).await.ok()?;
            let conditions = crd.status?.conditions?;
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
}

async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn checkpoint(
    name: &str,
    pod: &str,
    storage: &Path,
    leave_running: bool,
    keep: Option<u32>,
) -> Checkpoint {
    serde_json::from_value(json!({
        "apiVersion": "cuinterpose.dev/v1alpha1", "kind": "Checkpoint",
        "metadata": {"name": name, "namespace": namespace()},
        "spec": {"podName": pod, "storage": {"hostPath": storage.display().to_string()},
                 "leaveRunning": leave_running, "keep": keep}
    }))
    .unwrap()
}

/// Waits for a condition among `types` on checkpoint `name`; returns the object.
async fn outcome(
    api: &Api<Checkpoint>,
    name: &str,
    types: &[&str],
) -> (Checkpoint, String, String) {
    wait_for(&format!("an outcome of {name}"), || async {
        let object = api.get(name).await.ok()?;
        let status = object.status.clone()?;
        let c = status
            .conditions
            .iter()
            .find(|c| types.contains(&c.type_.as_str()))?
            .clone();
        Some((object, c.type_, c.message))
    })
    .await
}

/// Waits for the outcome of a restore of checkpoint `name`: Restored or RestoreFailed.
async fn restore_outcome(api: &Api<Checkpoint>, name: &str) -> (Checkpoint, String, String) {
    outcome(api, name, &[condition::RESTORED, condition::RESTORE_FAILED]).await
}

/// Waits for the outcome of checkpoint `name`: Completed, Refused, RolledBack or NeedsAttention.
async fn checkpoint_outcome(api: &Api<Checkpoint>, name: &str) -> (Checkpoint, String, String) {
    outcome(
        api,
        name,
        &[
            condition::COMPLETED,
            condition::REFUSED,
            condition::ROLLED_BACK,
            condition::NEEDS_ATTENTION,
        ],
    )
    .await
}

/// The Events the agent recorded about checkpoint `name`: (reason, note).
async fn events(client: &Client, name: &str) -> Vec<(String, String)> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("events.k8s.io", "v1", "Event"),
        "events",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace(), &resource);
    let list = api
        .list(&ListParams::default())
        .await
        .expect("listing events");
    list.items
        .iter()
        .filter(|e| {
            e.data["regarding"]["name"] == name && e.data["regarding"]["kind"] == "Checkpoint"
        })
        .map(|e| {
            (
                e.data["reason"].as_str().unwrap_or_default().to_string(),
                e.data["note"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits for an Event about checkpoint `name` that `wanted(reason, note)` accepts. The agent
/// publishes an Event after writing the status it describes, so the Event may trail the condition
/// a test has just seen.
async fn wait_for_event(
    client: &Client,
    name: &str,
    what: &str,
    wanted: impl Fn(&str, &str) -> bool,
) {
    let wanted = &wanted;
    wait_for(&format!("an event {what} about {name}"), || async move {
        events(client, name)
            .await
            .iter()
            .any(|(reason, note)| wanted(reason, note))
            .then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Kubernetes CRD API server: scripts/k8s-test-server.sh (scripts/test.sh runs it)"]
async fn the_agent_checkpoints_restores_and_discards_through_the_real_crd_server() {
    let client = client().await;
    install_crds(&client).await;
    let test = Test::new();
    let storage = test.env.dir().join("checkpoints");
    let pods = Arc::new(Pods::default());
    let controller = test.start_agent(&client, &pods);
    let api: Api<Checkpoint> = Api::namespaced(client.clone(), namespace());

    // Refusals surface as conditions (and Events), each with its message; nothing is written.
    let inject = [(OPT_IN_LABEL, "true")];
    pods.add(pod(
        "plain",
        "00000000-0000-0000-0000-00000000000a",
        "c-plain",
        &[],
        false,
    ));
    let idle_cgroup = PodCgroup::new(
        &test.cgroups,
        "00000000-0000-0000-0000-00000000000b",
        "c-idle",
    );
    let mut idle = test.start_in(
        &idle_cgroup,
        &test.tool,
        &["run", "--pid-namespace", "--", "/bin/sleep", "600"],
        "idle",
    );
    // The end of the chain sh, unshare, `cuinterpose run --pid-namespace`: before it, the agent
    // would find no PID-namespace init in the container and refuse for that instead.
    wait_for("the idle container's sleep", || async {
        idle_cgroup.runs("sleep").then_some(())
    })
    .await;
    pods.add(pod(
        "idle",
        "00000000-0000-0000-0000-00000000000b",
        "c-idle",
        &inject,
        true,
    ));
    let refusals = [
        ("ck-ghost", "ghost", "pod ghost not found".to_string()),
        ("ck-plain", "plain", "pod plain does not carry the label cuinterpose.dev/inject=true: cuinterpose did not shape it".to_string()),
        ("ck-idle", "idle", "no CUDA process".to_string()),
    ];
    for (name, pod_name, _) in &refusals {
        api.create(
            &PostParams::default(),
            &checkpoint(name, pod_name, &storage, true, None),
        )
        .await
        .expect("creating a checkpoint");
    }
    for (name, _, message) in &refusals {
        let (object, type_, got) = checkpoint_outcome(&api, name).await;
        assert_eq!(type_, condition::REFUSED, "{name}: {got}");
        assert!(
            got.contains(message.as_str()),
            "{name}: {got:?} should say {message:?}"
        );
        wait_for_event(&client, name, "Refused", |reason, note| {
            reason == condition::REFUSED && note.contains(message.as_str())
        })
        .await;
        if *name == "ck-idle" {
            // A refusal by the tool itself, after the agent found the container's root in its cgroup.
            assert_eq!(object.status.unwrap().node_name.as_deref(), Some(NODE));
        }
    }

    // A real checkpoint of the workload: Completed, with the tool's phases, files on disk, Events.
    let (uid, cid) = ("11111111-2222-3333-4444-555555555555", "c0ffee01");
    let cgroup = PodCgroup::new(&test.cgroups, uid, cid);
    let (mut launcher, listen) = test.start_workload(&cgroup);
    pods.add(pod("trainer", uid, cid, &inject, true));
    api.create(
        &PostParams::default(),
        &checkpoint("ck-1", "trainer", &storage, false, None),
    )
    .await
    .unwrap();
    let (object, type_, message) = checkpoint_outcome(&api, "ck-1").await;
    assert_eq!(type_, condition::COMPLETED, "{message}");
    let status = object.status.clone().unwrap();
    let dir = storage.join(namespace()).join("ck-1");
    assert_eq!(status.location.as_deref(), Some(dir.to_str().unwrap()));
    assert!(
        dir.join("manifest.json").is_file(),
        "the checkpoint's manifest"
    );
    assert!(status.image_bytes.unwrap() > 0);
    let phases: Vec<&str> = status.phases.iter().map(|p| p.name.as_str()).collect();
    for wanted in ["freeze", "save", "native-checkpoint", "criu-dump"] {
        assert!(phases.contains(&wanted), "{wanted} in {phases:?}");
    }
    assert!(status.phases.iter().all(|p| p.millis >= 0.0));
    assert!(
        status.condition(condition::IN_PROGRESS).is_none(),
        "InProgress is replaced by the outcome"
    );
    assert_eq!(status.checkpointed_containers.len(), 1);
    assert!(object.finalizers().contains(&FINALIZER.to_string()));
    wait_for_event(&client, "ck-1", "Started", |reason, _| reason == "Started").await;
    wait_for_event(&client, "ck-1", "Completed", |reason, note| {
        reason == condition::COMPLETED
            && note.contains("checkpointed container \"main\" of pod trainer")
    })
    .await;
    // leaveRunning: false ended the workload.
    control::launch::wait_exit(launcher.id(), WAIT).expect("the launcher ends with its workload");
    let _ = launcher.wait();

    // Restore into a placeholder pod: its own process keeps the container alive, the restored tree
    // joins its cgroup, and the memory is back.
    let (puid, pcid) = ("66666666-7777-8888-9999-000000000000", "c0ffee02");
    let placeholder_cgroup = PodCgroup::new(&test.cgroups, puid, pcid);
    let mut keepalive = test.start_in(
        &placeholder_cgroup,
        Path::new("/bin/sleep"),
        &["600"],
        "placeholder",
    );
    wait_for("the placeholder's process in its cgroup", || async {
        (!placeholder_cgroup.pids().is_empty()).then_some(())
    })
    .await;
    pods.add(placeholder_pod("trainer-restored", (puid, pcid), "ck-1"));
    let (object, type_, message) = restore_outcome(&api, "ck-1").await;
    assert_eq!(type_, condition::RESTORED, "{message}");
    assert!(
        message.starts_with("restored into pod trainer-restored"),
        "{message}"
    );
    assert_eq!(
        object.status.as_ref().unwrap().restored_into,
        ["trainer-restored"]
    );
    let ranks = test.ranks(&listen);
    for (r, w) in ranks.iter().enumerate() {
        w.assert_pattern(&format!("a{r}"), 100 + r as u64)
            .expect("contents after the restore");
    }
    // The restored tree (its PID-namespace init and the second rank) joined the placeholder's
    // cgroup, next to the placeholder's own process.
    assert!(
        message.contains("in its cgroups ")
            && message.contains(placeholder_cgroup.dir.to_str().unwrap()),
        "{message}"
    );
    let members = placeholder_cgroup.pids();
    let inits: Vec<u32> = members
        .iter()
        .copied()
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            status
                .lines()
                .any(|l| l.starts_with("NSpid:") && l.split_whitespace().last() == Some("1"))
        })
        .collect();
    assert_eq!(
        members.len(),
        3,
        "sleep + the two restored ranks: {members:?}"
    );
    // ... and its network, IPC and UTS namespaces, not the agent's nor the source pod's.
    assert!(
        message.contains("in its net, ipc, uts namespaces"),
        "{message}"
    );
    let ns_link = |pid: u32, ns: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
            .unwrap_or_else(|e| panic!("namespace {ns} of pid {pid}: {e}"))
    };
    for pid in &members {
        for ns in ["net", "ipc", "uts"] {
            assert_eq!(
                ns_link(*pid, ns),
                ns_link(keepalive.id(), ns),
                "pid {pid} is not in the placeholder's {ns} namespace"
            );
            assert_ne!(
                ns_link(*pid, ns),
                ns_link(std::process::id(), ns),
                "pid {pid} is in the agent's {ns} namespace"
            );
        }
    }
    assert_eq!(
        inits.len(),
        1,
        "one restored PID-namespace init among {members:?}"
    );
    wait_for_event(&client, "ck-1", "Restored", |reason, _| {
        reason == condition::RESTORED
    })
    .await;

    // Retention: checkpoints of the restored pod with keep 1; the second completed one deletes the
    // first, whose finalizer discards its files. The workload keeps running (leaveRunning).
    api.create(
        &PostParams::default(),
        &checkpoint("ck-2", "trainer-restored", &storage, true, Some(1)),
    )
    .await
    .unwrap();
    let (_, type_, message) = checkpoint_outcome(&api, "ck-2").await;
    assert_eq!(type_, condition::COMPLETED, "{message}");
    let dir2 = storage.join(namespace()).join("ck-2");
    assert!(dir2.join("manifest.json").is_file());
    api.create(
        &PostParams::default(),
        &checkpoint("ck-3", "trainer-restored", &storage, true, Some(1)),
    )
    .await
    .unwrap();
    let (_, type_, message) = checkpoint_outcome(&api, "ck-3").await;
    assert_eq!(type_, condition::COMPLETED, "{message}");
    wait_for("ck-2 deleted by retention", || async {
        matches!(api.get_opt("ck-2").await, Ok(None)).then_some(())
    })
    .await;
    assert!(!dir2.exists(), "ck-2's files were discarded");
    assert!(
        storage
            .join(namespace())
            .join("ck-3/manifest.json")
            .is_file(),
        "ck-3 is kept"
    );
    for (r, w) in test.ranks(&listen).iter().enumerate() {
        w.assert_pattern(&format!("a{r}"), 100 + r as u64)
            .expect("still running after a leave-running checkpoint");
    }

    // Deleting a checkpoint discards its files before the object goes.
    for name in ["ck-1", "ck-3"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
        wait_for(&format!("{name} gone"), || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
        assert!(
            !storage.join(namespace()).join(name).exists(),
            "{name}'s files were discarded"
        );
    }
    for (name, _, _) in &refusals {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    controller.abort();
    drop(placeholder_cgroup);
    drop(cgroup);
    drop(idle_cgroup);
    // The cgroups' drops killed what ran in them; reap our two children.
    let _ = idle.wait();
    let _ = keepalive.wait();
    let _ = std::fs::remove_dir(test.cgroups.join("kubepods/besteffort"));
    let _ = std::fs::remove_dir(test.cgroups.join("kubepods"));
    let _ = std::fs::remove_dir(&test.cgroups);
}

/// An ordinary pod's container in a real pod made through containerd's CRI as a kubelet makes it
/// (testkit::cri::Pod: the sandbox's pause container owning the pod's network, IPC and UTS
/// namespaces, the container in a PID namespace of its own with the kubelet's masked and
/// read-only paths and the runtime's seccomp profile, cgroups `/kubepods/besteffort/pod<uid>/<id>`
/// in every hierarchy): its process is the container's init, as the webhook shapes a container
/// without `CAP_SYS_ADMIN` (`cuinterpose run --`). The agent finds it from `Checkpoint` objects on
/// the real CRD server; two leave-running checkpoints with `keep: 1` (the first deleted by
/// retention, its files discarded), then one that ends it; restored into a placeholder pod's
/// container made through the CRI too, over that container's root filesystem, in its namespaces
/// and its cgroups in every hierarchy, the memory back; deleting the checkpoints discards their
/// files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Kubernetes CRD API server: scripts/k8s-test-server.sh (scripts/test.sh runs it)"]
async fn the_agent_checkpoints_a_cri_pods_container_and_restores_it_into_another_pods() {
    let Some(socket) = cri_socket() else {
        return;
    };
    let client = client().await;
    install_crds(&client).await;
    let test = Test::new();
    let storage = test.env.dir().join("checkpoints");
    let pods = Arc::new(Pods::default());
    let controller = test.start_agent(&client, &pods);
    let api: Api<Checkpoint> = Api::namespaced(client.clone(), namespace());
    let inject = [(OPT_IN_LABEL, "true")];

    let listen = test.env.socket_dir().join("app");
    let workload = test.env.artifacts().workload().expect("workload binary");
    let command = [
        test.tool.display().to_string(),
        "run".into(),
        "--".into(),
        workload.display().to_string(),
        "tree".into(),
        "--processes".into(),
        "2".into(),
        "--devices".into(),
        "0,1".into(),
        "--listen-dir".into(),
        listen.display().to_string(),
    ];
    let source = test
        .cri_pod(
            &socket,
            "app",
            "aaaaaaaa-0000-0000-0000-00000000000a",
            &command,
        )
        .await;
    let init = PathBuf::from(format!("/proc/{}", source.init));
    test.fill_ranks(&listen, || init.exists());
    assert_ne!(root_of(source.init), root_of(std::process::id()));
    // What makes it a kubelet's container rather than an emulated one: the runtime's seccomp
    // filter, the kubelet's masked and read-only paths, the sandbox's files and `/dev/shm`.
    assert_eq!(seccomp_mode(source.init), "2", "a seccomp filter");
    let mounts = std::fs::read_to_string(format!("/proc/{}/mountinfo", source.init)).unwrap();
    for point in [
        " /proc/keys ",
        " /proc/sys ",
        " /etc/hostname ",
        " /dev/shm ",
    ] {
        assert!(mounts.contains(point), "{point} in {mounts}");
    }
    pods.add(pod("app", &source.uid, &source.container, &inject, true));

    // Retention: two leave-running checkpoints with keep 1; the second deletes the first, whose
    // finalizer discards its files.
    for name in ["ck-app-1", "ck-app-2"] {
        api.create(
            &PostParams::default(),
            &checkpoint(name, "app", &storage, true, Some(1)),
        )
        .await
        .unwrap();
        let (_, type_, message) = checkpoint_outcome(&api, name).await;
        assert_eq!(type_, condition::COMPLETED, "{name}: {message}");
    }
    wait_for("ck-app-1 deleted by retention", || async {
        matches!(api.get_opt("ck-app-1").await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        !storage.join(namespace()).join("ck-app-1").exists(),
        "ck-app-1's files were discarded"
    );

    api.create(
        &PostParams::default(),
        &checkpoint("ck-app", "app", &storage, false, None),
    )
    .await
    .unwrap();
    let (_, type_, message) = checkpoint_outcome(&api, "ck-app").await;
    assert_eq!(type_, condition::COMPLETED, "{message}");
    let dir = storage.join(namespace()).join("ck-app");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("manifest JSON");
    assert!(
        manifest["criu"]["placement"]["container_init"]["node_mounts"].is_array(),
        "dumped as its container's init: {}",
        manifest["criu"]
    );
    // leaveRunning: false ended the workload, and with it the container.
    wait_for("the source container exited", || async {
        (source.state().await.ok()? == cri::CONTAINER_EXITED).then_some(())
    })
    .await;

    let placeholder = test
        .cri_pod(
            &socket,
            "app-restored",
            "bbbbbbbb-0000-0000-0000-00000000000b",
            &["sleep".into(), "600".into()],
        )
        .await;
    pods.add(placeholder_pod(
        "app-restored",
        (&placeholder.uid, &placeholder.container),
        "ck-app",
    ));
    let (_, type_, message) = restore_outcome(&api, "ck-app").await;
    assert_eq!(type_, condition::RESTORED, "{message}");
    for (r, w) in test.ranks(&listen).iter().enumerate() {
        w.assert_pattern(&format!("a{r}"), 100 + r as u64)
            .expect("contents after the restore");
    }
    // The restored ranks: in the placeholder container's cgroups in every hierarchy (the v1
    // controllers, the named ones and the unified one), over its root filesystem, in the pod's
    // network, IPC and UTS namespaces, rank 0 the init of a PID namespace of its own.
    let procfs = agent::cgroup::Procfs::default();
    let restored: Vec<u32> = procfs
        .container_processes(&placeholder.uid, Some(&placeholder.container))
        .expect("the placeholder's processes")
        .into_iter()
        .filter(|&pid| {
            control::discovery::describe(pid)
                .is_ok_and(|i| i.command.contains("cuinterpose-workload"))
        })
        .collect();
    assert_eq!(
        restored.len(),
        2,
        "the two ranks in the placeholder's cgroup: {message}"
    );
    let cgroups = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .unwrap_or_else(|e| panic!("the cgroups of pid {pid}: {e}"))
    };
    let ns_link = |pid: u32, ns: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{ns}"))
            .unwrap_or_else(|e| panic!("namespace {ns} of pid {pid}: {e}"))
    };
    for &pid in &restored {
        assert_eq!(
            cgroups(pid),
            cgroups(placeholder.init),
            "pid {pid} is in the placeholder container's cgroups"
        );
        assert_eq!(
            root_of(pid),
            root_of(placeholder.init),
            "pid {pid} runs over the placeholder container's root"
        );
        for ns in ["net", "ipc", "uts"] {
            assert_eq!(
                ns_link(pid, ns),
                ns_link(placeholder.init, ns),
                "{ns} of pid {pid}"
            );
        }
        assert_eq!(seccomp_mode(pid), "2", "CRIU restored pid {pid}'s filter");
    }
    assert!(
        restored
            .iter()
            .any(|&pid| control::discovery::describe(pid).is_ok_and(|i| i.ns_pid == 1)),
        "rank 0 is the init of its PID namespace"
    );

    for name in ["ck-app", "ck-app-2"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
        wait_for(&format!("{name} gone"), || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
        assert!(
            !storage.join(namespace()).join(name).exists(),
            "{name}'s files were discarded"
        );
    }
    controller.abort();
}

/// containerd's CRI socket (scripts/container-runtimes.sh start): `None`, the test skipping, where
/// it is not set, unless the runtimes are required (testkit::runtime), where that fails it.
fn cri_socket() -> Option<PathBuf> {
    let socket = std::env::var_os("CUINTERPOSE_TEST_CONTAINERD")
        .map(PathBuf::from)
        .filter(|p| p.exists());
    if socket.is_none() {
        let why =
            "no containerd (CUINTERPOSE_TEST_CONTAINERD: scripts/container-runtimes.sh start)";
        let required = std::env::var("CUINTERPOSE_TEST_RUNTIMES").is_ok_and(|v| v == "required");
        assert!(!required, "{why}: CI must run the real-pod test");
        eprintln!("skipped: {why}");
    }
    socket
}

/// `Seccomp:` of `/proc/<pid>/status` (0 none, 2 a filter).
fn seccomp_mode(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("the status of pid {pid}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}
