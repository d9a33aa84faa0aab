//! `cuinterpose run`: start a program with the shim preloaded. No shell, no lingering parent: the
//! tool prepends the shim to `LD_PRELOAD` and execs the command in its own place.

use anyhow::Context;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Directory of the control sockets (exported to the program as CUINTERPOSE_CONTROL_DIR)
    #[arg(long)]
    control_dir: Option<PathBuf>,
    /// Start the program as PID 1 of a new PID namespace (needed by `checkpoint`); the tool then
    /// stays as its parent, forwards SIGINT/SIGTERM/SIGHUP and exits with its status
    #[arg(long)]
    pid_namespace: bool,
    /// The interposer library (default: libcuinterpose.so next to this binary, or $CUINTERPOSE_SHIM)
    #[arg(long)]
    shim: Option<PathBuf>,
    /// The program and its arguments
    #[arg(trailing_var_arg = true, required = true, num_args = 1..)]
    command: Vec<OsString>,
}

pub fn run(args: RunArgs, config: &control::config::ToolConfig) -> anyhow::Result<()> {
    let shim = locate_shim(args.shim.as_deref(), config.shim.as_deref())?;
    let (program, rest) = args.command.split_first().context("no command given")?;
    check_program(Path::new(program))?;
    let mut command = std::process::Command::new(program);
    command.args(rest);
    command.env(
        "LD_PRELOAD",
        preload_with(&shim, std::env::var_os("LD_PRELOAD")),
    );
    if let Some(dir) = &args.control_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            crate::Usage(format!(
                "--control-dir {} cannot be used: {e}",
                dir.display()
            ))
        })?;
        command.env("CUINTERPOSE_CONTROL_DIR", dir);
    }
    if args.pid_namespace {
        let status = control::launch::run_in_pid_namespace(command)?;
        std::process::exit(control::launch::exit_code(status));
    }
    let error = command.exec();
    Err(error).with_context(|| format!("starting {}", Path::new(program).display()))
}

/// The shim's absolute path: `--shim`, else `configured` (`CUINTERPOSE_SHIM`) when it is a file,
/// else next to this executable.
pub fn locate_shim(explicit: Option<&Path>, configured: Option<&Path>) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = match explicit {
        Some(path) => vec![path.to_path_buf()],
        None => {
            let mut list: Vec<PathBuf> = configured.map(Path::to_path_buf).into_iter().collect();
            if let Some(dir) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
            {
                list.push(dir.join(control::discovery::SHIM_LIBRARY));
                list.push(dir.join("../lib").join(control::discovery::SHIM_LIBRARY));
            }
            list
        }
    };
    for candidate in &candidates {
        if candidate.is_file() {
            return std::fs::canonicalize(candidate)
                .with_context(|| format!("resolving {}", candidate.display()));
        }
    }
    Err(crate::Usage(format!(
        "{} not found (looked at {}); pass --shim PATH",
        control::discovery::SHIM_LIBRARY,
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .into())
}

/// The program to run must be an executable file, given by path or found in `PATH` as `execvp`
/// looks for it: checked before anything starts (a PID namespace, a launcher), a bad argument.
fn check_program(program: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.as_os_str().as_encoded_bytes().contains(&b'/') {
        executable(program)
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&path).any(|dir| executable(&dir.join(program)))
    };
    if found {
        Ok(())
    } else {
        Err(crate::Usage(format!(
            "{}: no such executable file{}",
            program.display(),
            if program.as_os_str().as_encoded_bytes().contains(&b'/') {
                ""
            } else {
                " in PATH"
            }
        ))
        .into())
    }
}

/// `LD_PRELOAD` with the shim first and not repeated. The loader splits on spaces and colons.
pub fn preload_with(shim: &Path, existing: Option<OsString>) -> OsString {
    let mut value = OsString::from(shim);
    if let Some(existing) = existing {
        let existing = existing.to_string_lossy().into_owned();
        for entry in existing.split([':', ' ']).filter(|e| !e.is_empty()) {
            if Path::new(entry) != shim {
                value.push(":");
                value.push(entry);
            }
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_goes_first_once() {
        let shim = Path::new("/opt/libcuinterpose.so");
        assert_eq!(preload_with(shim, None), "/opt/libcuinterpose.so");
        assert_eq!(
            preload_with(shim, Some("/a.so /opt/libcuinterpose.so:/b.so".into())),
            "/opt/libcuinterpose.so:/a.so:/b.so"
        );
    }
}
