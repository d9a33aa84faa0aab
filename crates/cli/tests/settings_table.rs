//! The settings table of `docs/settings.md` ("## Environment variables") against the two
//! configurations that read the environment: the shim's (`ShimConfig`) and the tool's
//! (`ToolConfig`). Every row names who reads it; each side's rows are exactly its `SETTINGS`, with
//! the same defaults (in the table's words, up to any parenthesis).

use control::config::ToolConfig;
use shim_runtime::config::ShimConfig;

struct Row {
    name: String,
    readers: Vec<String>,
    default: String,
}

fn documented_settings() -> Vec<Row> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/settings.md"
    ))
    .unwrap();
    let table = page
        .split("\n## Environment variables\n")
        .nth(1)
        .expect("docs/settings.md has a ## Environment variables section");
    let rows: Vec<Row> = table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|c| c.replace('`', "").trim().to_string())
                .collect();
            assert_eq!(cells.len(), 4, "{cells:?}");
            Row {
                name: cells[0].clone(),
                readers: cells[1].split(',').map(|r| r.trim().to_string()).collect(),
                default: cells[3].split(" (").next().unwrap().trim().to_string(),
            }
        })
        .collect();
    assert!(!rows.is_empty(), "the settings table has no rows");
    rows
}

/// The table's `(name, default)` pairs read by `reader`, sorted.
fn documented_for(reader: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = documented_settings()
        .into_iter()
        .filter(|row| row.readers.iter().any(|r| r == reader))
        .map(|row| (row.name, row.default))
        .collect();
    rows.sort();
    rows
}

fn sorted(pairs: impl Iterator<Item = (&'static str, &'static str)>) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = pairs
        .map(|(name, default)| (name.to_string(), default.to_string()))
        .collect();
    pairs.sort();
    pairs
}

#[test]
fn every_row_names_the_shim_or_the_tool_as_its_reader() {
    for row in documented_settings() {
        for reader in &row.readers {
            assert!(
                reader == "shim" || reader == "tool",
                "{}: reader {reader:?}",
                row.name
            );
        }
    }
}

#[test]
fn the_table_lists_what_the_shim_reads() {
    let ours = sorted(ShimConfig::SETTINGS.iter().map(|s| (s.name, s.default)));
    assert_eq!(documented_for("shim"), ours);
}

#[test]
fn the_table_lists_what_the_tool_reads() {
    let ours = sorted(ToolConfig::SETTINGS.iter().map(|s| (s.name, s.default)));
    assert_eq!(documented_for("tool"), ours);
}
