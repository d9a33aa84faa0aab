//! A small client of the Kubernetes Container Runtime Interface (`runtime.v1.RuntimeService`) for
//! tests: the calls a kubelet makes to run a pod (`RunPodSandbox`, `CreateContainer`,
//! `StartContainer`, `ContainerStatus`, and the removals), against the containerd that
//! `scripts/container-runtimes.sh start` runs (`CUINTERPOSE_TEST_CONTAINERD`, its socket; its CRI
//! plugin, the locally imported pause image `CUINTERPOSE_TEST_PAUSE_IMAGE`).
//!
//! gRPC here is what a unary call is on the wire: an HTTP/2 POST to `/<service>/<method>` with
//! `content-type: application/grpc`, the request as one length-prefixed protobuf message, the
//! answer likewise, and the outcome in the `grpc-status` and `grpc-message` trailers. That, over
//! hyper's HTTP/2 client on the Unix socket, is all a test needs; the messages are the subset of
//! `k8s.io/cri-api/pkg/apis/runtime/v1/api.proto` that these calls use, written as prost structs
//! with the proto's field numbers (fields left out are absent on the wire, as proto3 wants for
//! defaults). So no protobuf compiler and no gRPC framework enter the build.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What a CRI call failed with.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("connecting to {path}: {source}")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP/2 to the CRI socket: {0}")]
    Http(#[from] hyper::Error),
    #[error("building the request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("{method}: gRPC status {code}: {message}")]
    Status {
        method: &'static str,
        code: u32,
        message: String,
    },
    #[error("{method}: the answer is not one gRPC message ({0} bytes)", .len)]
    Framing { method: &'static str, len: usize },
    #[error("container {container} does not run after its start (CRI state {state})")]
    NotRunning { container: String, state: i32 },
    #[error("{method}: decoding the answer: {source}")]
    Decode {
        method: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

/// A connection to a CRI runtime service.
#[derive(Debug)]
pub struct Cri {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
}

impl Cri {
    /// Connects to the CRI socket at `socket` (the connection runs on the current tokio runtime).
    pub async fn connect(socket: &Path) -> Result<Cri, CriError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|source| CriError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        // The connection's I/O runs on its own task; its end (the socket closed) surfaces as the
        // next call's error.
        tokio::spawn(connection);
        Ok(Cri { sender })
    }

    async fn call<Req: Message, Resp: Message + Default>(
        &self,
        method: &'static str,
        request: &Req,
    ) -> Result<Resp, CriError> {
        // A gRPC message: a compression flag (0: none), its length (big-endian u32), the bytes.
        let body = request.encode_to_vec();
        let mut framed = Vec::with_capacity(5 + body.len());
        framed.push(0);
        framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
        framed.extend_from_slice(&body);
        let http = hyper::Request::post(format!(
            "http://localhost/runtime.v1.RuntimeService/{method}"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(framed)))?;
        let mut sender = self.sender.clone();
        sender.ready().await?;
        let (parts, body) = sender.send_request(http).await?.into_parts();
        let collected = body.collect().await?;
        // A failure without a message may come as headers only ("Trailers-Only").
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| parts.headers.get(name))
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let code = field("grpc-status")
            .and_then(|c| c.parse().ok())
            .unwrap_or(if parts.status.is_success() { 0 } else { 2 });
        if code != 0 {
            return Err(CriError::Status {
                method,
                code,
                message: field("grpc-message")
                    .map(|m| percent_decode(&m))
                    .unwrap_or_else(|| format!("HTTP {}", parts.status)),
            });
        }
        let bytes = collected.to_bytes();
        let message = match bytes.get(..5) {
            Some([0, len @ ..]) => {
                let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
                bytes
                    .get(5..5 + len)
                    .filter(|_| bytes.len() == 5 + len)
                    .ok_or(CriError::Framing {
                        method,
                        len: bytes.len(),
                    })?
            }
            _ => {
                return Err(CriError::Framing {
                    method,
                    len: bytes.len(),
                });
            }
        };
        Resp::decode(message).map_err(|source| CriError::Decode { method, source })
    }

    /// Runs a pod sandbox (the pause container, the pod's network, IPC and UTS namespaces, its
    /// cgroup under `config.linux.cgroup_parent`); returns its ID.
    pub async fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String, CriError> {
        let request = RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let response: RunPodSandboxResponse = self.call("RunPodSandbox", &request).await?;
        Ok(response.pod_sandbox_id)
    }

    /// Creates a container in sandbox `sandbox` (made with `sandbox_config`); returns its ID.
    pub async fn create_container(
        &self,
        sandbox: &str,
        config: &ContainerConfig,
        sandbox_config: &PodSandboxConfig,
    ) -> Result<String, CriError> {
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let response: CreateContainerResponse = self.call("CreateContainer", &request).await?;
        Ok(response.container_id)
    }

    /// Starts container `id`.
    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let request = ContainerIdRequest { id: id.into() };
        let _: Empty = self.call("StartContainer", &request).await?;
        Ok(())
    }

    /// The state of container `id` ([`CONTAINER_RUNNING`] and the others) and, from the verbose
    /// information containerd gives, the host PID of its init (0 when it has none).
    pub async fn container_status(&self, id: &str) -> Result<(i32, u32), CriError> {
        let request = ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        };
        let response: ContainerStatusResponse = self.call("ContainerStatus", &request).await?;
        let state = response.status.map_or(CONTAINER_UNKNOWN, |s| s.state);
        // containerd's "info" is JSON with the init's `pid`.
        let pid = response
            .info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|i| i.get("pid")?.as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0);
        Ok((state, pid))
    }

    /// Stops and removes sandbox `id` with its containers (both idempotent in the CRI).
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = SandboxIdRequest { id: id.into() };
        let _: Empty = self.call("StopPodSandbox", &request).await?;
        let _: Empty = self.call("RemovePodSandbox", &request).await?;
        Ok(())
    }
}

/// The paths a kubelet asks the runtime to mask in an unprivileged container (its default
/// `procMount`): the runtime itself masks only what it is asked to through the CRI.
pub const KUBELET_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// The paths a kubelet asks the runtime to make read-only in an unprivileged container.
pub const KUBELET_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A pod of one container as a kubelet runs it for a best-effort pod with the cgroupfs driver:
/// the sandbox (pause container; the pod's network, IPC and UTS namespaces) under
/// `/kubepods/besteffort/pod<uid>`, the container in it with a PID namespace of its own, the
/// kubelet's masked and read-only paths and the runtime's default seccomp profile (what a kubelet
/// with `--seccomp-default` asks for), its output in `log_dir`. Stopped and removed when dropped.
#[derive(Debug)]
pub struct Pod {
    socket: PathBuf,
    /// The pod's UID (its cgroup's name).
    pub uid: String,
    /// The sandbox's ID.
    pub sandbox: String,
    /// The container's ID (the kubelet reports it as `containerd://<id>`).
    pub container: String,
    /// The host PID of the container's init.
    pub init: u32,
}

/// What a [`Pod`] runs.
#[derive(Debug, Clone)]
pub struct PodSpec<'a> {
    /// The pod's name (and its container's: `main`).
    pub name: &'a str,
    pub uid: &'a str,
    /// The container's image (imported into containerd's `k8s.io` namespace).
    pub image: &'a str,
    /// The container's command.
    pub command: Vec<String>,
    /// Its whole environment.
    pub envs: Vec<(String, String)>,
    /// Host directories bound read-write at their own paths (the host's `/usr` is bound read-only
    /// too, as for every container of these tests).
    pub binds: &'a [&'a Path],
    /// Where the sandbox's logs go (the container's in `<log_dir>/main.log`).
    pub log_dir: &'a Path,
}

impl Pod {
    /// Runs the pod through the CRI socket `socket` and waits for its container to run.
    pub async fn run(socket: &Path, spec: PodSpec<'_>) -> Result<Pod, CriError> {
        let cri = Cri::connect(socket).await?;
        let pod_namespaces = NamespaceOption {
            network: NAMESPACE_POD,
            pid: NAMESPACE_CONTAINER,
            ipc: NAMESPACE_POD,
        };
        let sandbox_config = PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: spec.name.into(),
                uid: spec.uid.into(),
                namespace: "cuinterpose-test".into(),
                attempt: 0,
            }),
            hostname: spec.name.into(),
            log_directory: spec.log_dir.display().to_string(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: format!("/kubepods/besteffort/pod{}", spec.uid),
                security_context: Some(LinuxSandboxSecurityContext {
                    namespace_options: Some(pod_namespaces.clone()),
                    privileged: false,
                }),
            }),
        };
        let sandbox = cri.run_pod_sandbox(&sandbox_config).await?;
        let mut pod = Pod {
            socket: socket.to_path_buf(),
            uid: spec.uid.into(),
            sandbox,
            container: String::new(),
            init: 0,
        };
        let mut mounts = vec![Mount {
            container_path: "/usr".into(),
            host_path: "/usr".into(),
            readonly: true,
        }];
        mounts.extend(spec.binds.iter().map(|b| Mount {
            container_path: b.display().to_string(),
            host_path: b.display().to_string(),
            readonly: false,
        }));
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "main".into(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: spec.image.into(),
            }),
            command: spec.command,
            envs: (spec.envs.into_iter())
                .map(|(key, value)| KeyValue { key, value })
                .collect(),
            mounts,
            log_path: "main.log".into(),
            linux: Some(LinuxContainerConfig {
                security_context: Some(LinuxContainerSecurityContext {
                    privileged: false,
                    namespace_options: Some(pod_namespaces),
                    masked_paths: KUBELET_MASKED_PATHS.iter().map(|p| p.to_string()).collect(),
                    readonly_paths: KUBELET_READONLY_PATHS
                        .iter()
                        .map(|p| p.to_string())
                        .collect(),
                    seccomp: Some(SecurityProfile { profile_type: 0 }),
                }),
            }),
            ..Default::default()
        };
        pod.container = cri
            .create_container(&pod.sandbox, &config, &sandbox_config)
            .await?;
        cri.start_container(&pod.container).await?;
        let (state, init) = cri.container_status(&pod.container).await?;
        if state != CONTAINER_RUNNING || init == 0 {
            return Err(CriError::NotRunning {
                container: pod.container.clone(),
                state,
            });
        }
        pod.init = init;
        Ok(pod)
    }

    /// The container's state ([`CONTAINER_RUNNING`], [`CONTAINER_EXITED`], ...).
    pub async fn state(&self) -> Result<i32, CriError> {
        let cri = Cri::connect(&self.socket).await?;
        Ok(cri.container_status(&self.container).await?.0)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        // Drop cannot await: a thread of its own with a runtime of its own makes the two calls
        // (this may run inside the test's runtime, where blocking on another is refused).
        let (socket, sandbox) = (self.socket.clone(), self.sandbox.clone());
        let removed = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let cri = Cri::connect(&socket).await.map_err(|e| e.to_string())?;
                cri.remove_pod_sandbox(&sandbox)
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .join();
        if let Ok(Err(e)) = removed {
            eprintln!("removing pod sandbox {}: {e}", self.sandbox);
        }
    }
}

/// `grpc-message` is percent-encoded (gRPC's HTTP/2 protocol spec).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `ContainerState.CONTAINER_RUNNING`.
pub const CONTAINER_RUNNING: i32 = 1;
/// `ContainerState.CONTAINER_EXITED`.
pub const CONTAINER_EXITED: i32 = 2;
/// `ContainerState.CONTAINER_UNKNOWN`.
pub const CONTAINER_UNKNOWN: i32 = 3;
/// `NamespaceMode.POD`: shared by the pod's containers.
pub const NAMESPACE_POD: i32 = 0;
/// `NamespaceMode.CONTAINER`: the container's own (the kubelet's choice for PID by default).
pub const NAMESPACE_CONTAINER: i32 = 1;

/// `PodSandboxMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `PodSandboxConfig` (no DNS, port mappings, labels, annotations or Windows settings).
#[derive(Clone, PartialEq, Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

/// `LinuxPodSandboxConfig` (no sysctls, overhead or resources).
#[derive(Clone, PartialEq, Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

/// `LinuxSandboxSecurityContext` (namespaces and privilege only).
#[derive(Clone, PartialEq, Message)]
pub struct LinuxSandboxSecurityContext {
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(bool, tag = "6")]
    pub privileged: bool,
}

/// `NamespaceOption` (`NamespaceMode`s: [`NAMESPACE_POD`], [`NAMESPACE_CONTAINER`]).
#[derive(Clone, PartialEq, Message)]
pub struct NamespaceOption {
    #[prost(int32, tag = "1")]
    pub network: i32,
    #[prost(int32, tag = "2")]
    pub pid: i32,
    #[prost(int32, tag = "3")]
    pub ipc: i32,
}

/// `ContainerMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

/// `ImageSpec` (the reference only).
#[derive(Clone, PartialEq, Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
}

/// `KeyValue` (an environment variable).
#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `Mount` (a host path; private propagation).
#[derive(Clone, PartialEq, Message)]
pub struct Mount {
    #[prost(string, tag = "1")]
    pub container_path: String,
    #[prost(string, tag = "2")]
    pub host_path: String,
    #[prost(bool, tag = "3")]
    pub readonly: bool,
}

/// `ContainerConfig` (no working directory, devices, labels, terminal or Windows settings).
#[derive(Clone, PartialEq, Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub envs: Vec<KeyValue>,
    #[prost(message, repeated, tag = "7")]
    pub mounts: Vec<Mount>,
    #[prost(string, tag = "11")]
    pub log_path: String,
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

/// `LinuxContainerConfig` (the security context only).
#[derive(Clone, PartialEq, Message)]
pub struct LinuxContainerConfig {
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

/// `LinuxContainerSecurityContext` (privilege, namespaces, masked and read-only paths, seccomp).
#[derive(Clone, PartialEq, Message)]
pub struct LinuxContainerSecurityContext {
    #[prost(bool, tag = "2")]
    pub privileged: bool,
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
    #[prost(string, repeated, tag = "13")]
    pub masked_paths: Vec<String>,
    #[prost(string, repeated, tag = "14")]
    pub readonly_paths: Vec<String>,
    #[prost(message, optional, tag = "15")]
    pub seccomp: Option<SecurityProfile>,
}

/// `SecurityProfile`: `profile_type` 0 is the runtime's default profile, 1 unconfined.
#[derive(Clone, PartialEq, Message)]
pub struct SecurityProfile {
    #[prost(int32, tag = "1")]
    pub profile_type: i32,
}

#[derive(Clone, PartialEq, Message)]
struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    runtime_handler: String,
}

#[derive(Clone, PartialEq, Message)]
struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
}

/// `StopPodSandboxRequest` and `RemovePodSandboxRequest`.
#[derive(Clone, PartialEq, Message)]
struct SandboxIdRequest {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, Message)]
struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, Message)]
struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    container_id: String,
}

/// `StartContainerRequest`.
#[derive(Clone, PartialEq, Message)]
struct ContainerIdRequest {
    #[prost(string, tag = "1")]
    id: String,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerStatusRequest {
    #[prost(string, tag = "1")]
    container_id: String,
    #[prost(bool, tag = "2")]
    verbose: bool,
}

/// `ContainerStatus` (its state only).
#[derive(Clone, PartialEq, Message)]
struct ContainerStatus {
    #[prost(int32, tag = "3")]
    state: i32,
}

#[derive(Clone, PartialEq, Message)]
struct ContainerStatusResponse {
    #[prost(message, optional, tag = "1")]
    status: Option<ContainerStatus>,
    #[prost(map = "string, string", tag = "2")]
    info: HashMap<String, String>,
}

/// The responses with no fields.
#[derive(Clone, PartialEq, Message)]
struct Empty {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of a request as the proto's field numbers and wire types make them.
    #[test]
    fn messages_use_the_protos_field_numbers() {
        let request = ContainerStatusRequest {
            container_id: "ab".into(),
            verbose: true,
        };
        // Field 1, length-delimited: "ab"; field 2, varint: 1.
        assert_eq!(request.encode_to_vec(), [0x0a, 2, b'a', b'b', 0x10, 1]);
        let config = PodSandboxConfig {
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: "/k".into(),
                security_context: None,
            }),
            ..Default::default()
        };
        // Field 8 (LinuxPodSandboxConfig) holding field 1 (cgroup_parent).
        assert_eq!(config.encode_to_vec(), [0x42, 4, 0x0a, 2, b'/', b'k']);
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decode("image %22x%22 not found%"),
            "image \"x\" not found%"
        );
    }
}
