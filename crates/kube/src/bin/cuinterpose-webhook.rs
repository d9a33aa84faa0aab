//! `cuinterpose-webhook`: the mutating admission webhook that shapes opted-in pods (`serve`), and
//! the init container's copy of the launcher and the shim (`install`).

use anyhow::Context;
use clap::{Parser, Subcommand};
use cuinterpose_kube::{install, shaping, webhook};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "cuinterpose-webhook", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the webhook over HTTPS
    Serve {
        /// Address to listen on
        #[arg(long, default_value = "0.0.0.0:8443")]
        listen: String,
        /// PEM certificate chain (the name the API server calls: <service>.<namespace>.svc)
        #[arg(long)]
        tls_cert: PathBuf,
        /// PEM private key
        #[arg(long)]
        tls_key: PathBuf,
        /// The product image for the init container, pinned by digest (name@sha256:...)
        #[arg(long, env = "CUINTERPOSE_IMAGE")]
        image: String,
        /// CPU of the init container (requests = limits)
        #[arg(long, default_value = "100m")]
        init_cpu: String,
        /// Memory of the init container (requests = limits)
        #[arg(long, default_value = "64Mi")]
        init_memory: String,
    },
    /// Copy the launcher and the shim from the directory of this binary into DIR (the init container)
    Install { dir: PathBuf },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CUINTERPOSE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Serve {
            listen,
            tls_cert,
            tls_key,
            image,
            init_cpu,
            init_memory,
        } => {
            let config = shaping::ShapeConfig::new(image, init_cpu, init_memory)?;
            let tls = webhook::tls_config(&tls_cert, &tls_key)?;
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("listening on {listen}"))?;
            tracing::info!("serving {} on {listen}", webhook::MUTATE_PATH);
            tokio::select! {
                result = webhook::serve(listener, tls, config) => result?,
                _ = tokio::signal::ctrl_c() => {}
            }
            Ok(())
        }
        Command::Install { dir } => {
            let exe = std::env::current_exe().context("locating this binary")?;
            let from = exe.parent().context("this binary has no directory")?;
            for path in install::install(from, &dir)? {
                println!("installed {}", path.display());
            }
            Ok(())
        }
    }
}
