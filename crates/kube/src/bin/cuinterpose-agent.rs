//! `cuinterpose-agent`: the node agent (`run`, in the DaemonSet) and the CRD it serves (`crd`).

use anyhow::Context;
use clap::{Parser, Subcommand};
use cuinterpose_kube::agent::{self, ApiPods, tool::ToolOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "cuinterpose-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Watch Checkpoint objects and act for the pods on this node
    Run {
        /// This node's name (the DaemonSet passes spec.nodeName)
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        /// The CRIU binary (default: $CUINTERPOSE_CRIU, then criu on PATH)
        #[arg(long)]
        criu: Option<PathBuf>,
        /// The CUDA driver library (default: libcuda.so.1 from the loader's path)
        #[arg(long)]
        driver: Option<PathBuf>,
        /// Seconds the shims get to finish tracked calls in flight
        #[arg(long, default_value_t = 30)]
        freeze_timeout: u64,
    },
    /// Print the Checkpoint CustomResourceDefinition (deploy/kubernetes/crd/checkpoints.yaml)
    Crd,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CUINTERPOSE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Crd => {
            print!("{}", cuinterpose_kube::crd::crd_yaml());
            Ok(())
        }
        Command::Run {
            node_name,
            criu,
            driver,
            freeze_timeout,
        } => {
            let client = kube::Client::try_default()
                .await
                .context("connecting to the Kubernetes API")?;
            let config = control::config::ToolConfig::from_env()
                .context("reading the tool's settings (docs/settings.md)")?;
            control::runlock::configure(&config);
            let tool = ToolOptions {
                criu,
                driver,
                freeze_timeout: Duration::from_secs(freeze_timeout),
                config,
            };
            let pods = Arc::new(ApiPods {
                client: client.clone(),
            });
            let context = Arc::new(agent::Context::new(client, node_name, pods, tool));
            tokio::select! {
                () = agent::run(context) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            Ok(())
        }
    }
}
