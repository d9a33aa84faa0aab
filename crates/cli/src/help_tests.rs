//! Every argument of every command says what it is for in `--help` (and so in the manual page and
//! the completions, generated from the same definitions).

use crate::Cli;
use clap::CommandFactory;

/// `command path: --flag` of every argument without help text, through the whole command tree.
fn without_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for arg in command.get_arguments() {
        // clap's own --help and --version carry their own text.
        if matches!(arg.get_id().as_str(), "help" | "version") {
            continue;
        }
        let has_help = arg
            .get_help()
            .is_some_and(|h| !h.to_string().trim().is_empty());
        if !has_help {
            let name = arg
                .get_long()
                .map(|l| format!("--{l}"))
                .unwrap_or_else(|| arg.get_id().to_string());
            missing.push(format!("{path}: {name}"));
        }
    }
    for sub in command.get_subcommands() {
        if sub.get_about().is_none() && !sub.is_hide_set() {
            missing.push(format!("{path} {}: (no about)", sub.get_name()));
        }
        without_help(sub, &format!("{path} {}", sub.get_name()), missing);
    }
}

#[test]
fn every_argument_has_help() {
    let command = Cli::command();
    command.clone().debug_assert();
    let mut missing = Vec::new();
    without_help(&command, "cuinterpose", &mut missing);
    assert!(
        missing.is_empty(),
        "arguments without help:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_walk_sees_nested_arguments() {
    // The check above is only as good as the walk: it must reach a flag two levels down.
    let command = Cli::command();
    let checkpoint = command
        .find_subcommand("checkpoint")
        .expect("checkpoint command");
    let mut names: Vec<String> = Vec::new();
    let bare = clap::Command::new("t").subcommand(
        clap::Command::new("s").arg(clap::Arg::new("undocumented").long("undocumented")),
    );
    without_help(&bare, "t", &mut names);
    assert_eq!(names, ["t s: (no about)", "t s: --undocumented"]);
    assert!(
        checkpoint
            .get_arguments()
            .any(|a| a.get_long() == Some("freeze-timeout"))
    );
}
