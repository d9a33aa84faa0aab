//! Shell completions and manual pages, generated from the argument definitions (clap_complete,
//! clap_mangen), so they never drift from what the tool accepts. scripts/build-dist.sh writes them
//! into the release layout's share/.

use anyhow::Context;
use clap::CommandFactory;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write cuinterpose.1 and one cuinterpose-<command>.1 per command into this directory instead
    /// of printing cuinterpose.1
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = crate::Cli::command();
    clap_complete::generate(
        args.shell,
        &mut command,
        "cuinterpose",
        &mut std::io::stdout(),
    );
    Ok(())
}

pub fn man(args: ManArgs) -> anyhow::Result<()> {
    let command = crate::Cli::command();
    match args.dir {
        None => clap_mangen::Man::new(command)
            .render(&mut std::io::stdout())
            .context("writing the manual page"),
        Some(dir) => write_pages(command, &dir),
    }
}

/// The page of the tool and one per (visible) command.
fn write_pages(command: clap::Command, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, page: clap::Command| -> anyhow::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        clap_mangen::Man::new(page)
            .render(&mut file)
            .with_context(|| format!("writing {}", path.display()))
    };
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("cuinterpose-{}", sub.get_name());
        write(&name, sub.clone().display_name(name.clone()))?;
    }
    write("cuinterpose", command)
}
