//! A container named by its runtime, for `checkpoint --container` and `restore --container` without
//! Kubernetes: `podman:NAME` (a name or ID, as `podman inspect` takes it) or `containerd:ID` (a
//! task of containerd, as `ctr task ls` lists it; `ctr` reads `CONTAINERD_ADDRESS` and
//! `CONTAINERD_NAMESPACE`, so a pod's container made through the CRI is `containerd:ID` with
//! `CONTAINERD_NAMESPACE=k8s.io`). The tool asks the runtime's own client for the host PID of the
//! container's init, and refuses, naming the container, when the runtime does not know it or it
//! does not run: nothing has changed then.

use crate::ControlError;
use std::process::Command;

/// Which runtime names the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Podman,
    Containerd,
}

/// `RUNTIME:NAME`, as the command line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRef {
    pub runtime: Runtime,
    pub name: String,
}

impl std::fmt::Display for ContainerRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runtime = match self.runtime {
            Runtime::Podman => "podman",
            Runtime::Containerd => "containerd",
        };
        write!(f, "{runtime}:{}", self.name)
    }
}

impl std::str::FromStr for ContainerRef {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (runtime, name) = text.split_once(':').ok_or_else(|| {
            format!("{text:?} is not RUNTIME:NAME (podman:NAME or containerd:ID)")
        })?;
        let runtime = match runtime {
            "podman" => Runtime::Podman,
            "containerd" => Runtime::Containerd,
            other => {
                return Err(format!(
                    "unknown runtime {other:?} in {text:?}: podman or containerd"
                ));
            }
        };
        if name.is_empty() {
            return Err(format!("{text:?} names no container"));
        }
        Ok(ContainerRef {
            runtime,
            name: name.to_string(),
        })
    }
}

/// The host PID of the init of `container`, as its runtime reports it.
pub fn init_pid(container: &ContainerRef) -> Result<u32, ControlError> {
    let refuse = |reason: String| ControlError::Container {
        container: container.to_string(),
        reason,
    };
    let (program, args): (&str, Vec<&str>) = match container.runtime {
        Runtime::Podman => (
            "podman",
            vec![
                "inspect",
                "--type",
                "container",
                "--format",
                "{{.State.Pid}}",
                &container.name,
            ],
        ),
        Runtime::Containerd => ("ctr", vec!["task", "ls"]),
    };
    let output = Command::new(program)
        .args(&args)
        .output()
        .map_err(|e| refuse(format!("running {program}: {e}")))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(refuse(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            stderr.trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pid = match container.runtime {
        Runtime::Podman => stdout.trim().parse::<u32>().ok(),
        Runtime::Containerd => task_pid(&stdout, &container.name)
            .ok_or_else(|| refuse("containerd has no task of that ID (ctr task ls; CONTAINERD_NAMESPACE selects the namespace, k8s.io for a pod's containers)".into()))?,
    };
    match pid {
        Some(pid) if pid > 0 => Ok(pid),
        _ => Err(refuse(format!(
            "it does not run (its init's PID: {:?})",
            stdout.trim()
        ))),
    }
}

/// The PID `ctr task ls` lists for task `id` (`TASK PID STATUS` lines): `Some(None)` when the
/// task is listed without a running process, `None` when it is not listed.
fn task_pid(listing: &str, id: &str) -> Option<Option<u32>> {
    listing.lines().skip(1).find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(id)).then(|| {
            let pid = words.next().and_then(|p| p.parse().ok());
            let running = words.next() == Some("RUNNING");
            pid.filter(|_| running)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_references() {
        assert_eq!(
            "podman:job".parse(),
            Ok(ContainerRef {
                runtime: Runtime::Podman,
                name: "job".into()
            })
        );
        let containerd: ContainerRef = "containerd:ab12".parse().unwrap();
        assert_eq!(containerd.runtime, Runtime::Containerd);
        assert_eq!(containerd.to_string(), "containerd:ab12");
        assert!("job".parse::<ContainerRef>().is_err());
        assert!(
            "docker:job"
                .parse::<ContainerRef>()
                .unwrap_err()
                .contains("docker")
        );
        assert!("podman:".parse::<ContainerRef>().is_err());
    }

    #[test]
    fn ctr_task_listings() {
        let listing =
            "TASK    PID      STATUS\njob     4242     RUNNING\nold     0        STOPPED\n";
        assert_eq!(task_pid(listing, "job"), Some(Some(4242)));
        assert_eq!(task_pid(listing, "old"), Some(None));
        assert_eq!(task_pid(listing, "jo"), None);
        assert_eq!(task_pid(listing, "TASK"), None);
    }

    #[test]
    fn a_container_the_runtime_lacks_is_refused_by_name() {
        let missing = ContainerRef {
            runtime: Runtime::Podman,
            name: "cuinterpose-no-such-container".into(),
        };
        let error = init_pid(&missing).unwrap_err().to_string();
        assert!(
            error.contains("podman:cuinterpose-no-such-container"),
            "{error}"
        );
    }
}
