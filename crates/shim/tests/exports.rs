//! The built library's ELF interface: exactly the table's symbols are exported, no CUDA library
//! is NEEDED, and the glibc symbol versions it requires stay within the supported baseline.
//! Uses binutils (`nm`, `readelf`), as the build checks of the prior art did.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

/// Reads crates/cuda/src/driver_table.rs for its names (the same table the library and build.rs read).
macro_rules! interposer_table {
    (
        interception { $($i:ident),* $(,)? }
        wrapped {
            $( #[hook $wh:tt] $w:ident $(= $wb:ident @ $wv:literal)? ( $($wa:ident : $wt:ty),* $(,)? ); )*
        }
        gated { $( $g:ident $(= $gb:ident @ $gv:literal)? ( $($ga:ident : $gt:ty),* $(,)? ); )* }
        called { $( $c:ident $(= $cb:ident @ $cv:literal)? ( $($ca:ident : $ct:ty),* $(,)? ); )* }
    ) => {
        const INTERCEPTION: &[&str] = &[$(stringify!($i)),*];
        const WRAPPED: &[&str] = &[$(stringify!($w)),*];
        const GATED: &[&str] = &[$(stringify!($g)),*];
        const CALLED: &[&str] = &[$(stringify!($c)),*];
    };
}

include!("../../cuda/src/driver_table.rs");

/// The highest glibc symbol version the shim may require: what a Debian 12 build gives.
const GLIBC_MAX: (u32, u32) = (2, 36);

fn tool(program: &str, args: &[&str]) -> String {
    let shim = common::shim();
    let output = Command::new(program)
        .args(args)
        .arg(&shim)
        .output()
        .unwrap_or_else(|e| panic!("running {program} (binutils is needed for this test): {e}"));
    assert!(
        output.status.success(),
        "{program} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn exports_are_exactly_the_table() {
    let listing = tool("nm", &["-D", "--defined-only"]);
    let exported: BTreeSet<&str> = listing
        .lines()
        .filter_map(|line| line.split_whitespace().nth(2))
        .collect();
    let expected: BTreeSet<&str> = INTERCEPTION
        .iter()
        .chain(WRAPPED)
        .chain(GATED)
        .copied()
        .collect();
    assert_eq!(
        exported, expected,
        "dynamic exports of libcuinterpose.so vs src/driver_table.rs"
    );
    for name in CALLED {
        assert!(
            !exported.contains(name),
            "{name} is only called, never exported"
        );
    }
}

#[test]
fn no_cuda_library_is_needed() {
    let dynamic = tool("readelf", &["-d", "-W"]);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| line.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(
        !needed.is_empty(),
        "no NEEDED entries parsed from:\n{dynamic}"
    );
    for library in &needed {
        assert!(
            !library.starts_with("libcuda") && !library.starts_with("libcudart"),
            "{library} in NEEDED: the driver must be found at run time"
        );
    }
    println!("NEEDED: {needed:?}");
}

#[test]
fn glibc_requirement_stays_within_the_baseline() {
    let versions = tool("readelf", &["--version-info", "-W"]);
    let required: BTreeSet<(u32, u32, u32)> = versions
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|version| {
            let mut parts = version.split('.').map(str::parse::<u32>);
            let major = parts.next()?.ok()?;
            let minor = parts.next()?.ok()?;
            let patch = parts.next().and_then(Result::ok).unwrap_or(0);
            Some((major, minor, patch))
        })
        .collect();
    let highest = required
        .iter()
        .next_back()
        .copied()
        .expect("GLIBC versions listed");
    println!(
        "highest glibc symbol version required: GLIBC_{}.{}",
        highest.0, highest.1
    );
    assert!(
        (highest.0, highest.1) <= GLIBC_MAX,
        "libcuinterpose.so requires GLIBC_{}.{}, above GLIBC_{}.{}",
        highest.0,
        highest.1,
        GLIBC_MAX.0,
        GLIBC_MAX.1
    );
}
