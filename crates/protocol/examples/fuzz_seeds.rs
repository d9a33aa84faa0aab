//! Writes a seed corpus for each fuzz target in `fuzz/` into the directory given as the only
//! argument (`<dir>/<target>/<n>`), from the same valid samples the totality test uses, so that
//! the fuzzers start from inputs of the current formats. `scripts/fuzz.sh` runs it.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::{group, manifest_for, requests, responses};
use cuinterpose_protocol::message::{encode_request, encode_response};
use cuinterpose_protocol::state::{self, STATE_HEADER_LEN};
use cuinterpose_protocol::ticket::Ticket;
use cuinterpose_protocol::{AllocationId, manifest};

fn write_all(dir: &Path, target: &str, inputs: &[Vec<u8>]) -> std::io::Result<()> {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    for (n, input) in inputs.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{n}")), input)?;
    }
    Ok(())
}

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: fuzz_seeds DIR");
        std::process::exit(2);
    };
    write_all(
        &dir,
        "frame_request",
        &requests().iter().map(encode_request).collect::<Vec<_>>(),
    )?;
    write_all(
        &dir,
        "frame_response",
        &responses().iter().map(encode_response).collect::<Vec<_>>(),
    )?;
    let ticket = Ticket {
        creator_ns_pid: 41,
        id: AllocationId([0x5a; 16]),
        size: 2 << 20,
        multicast: false,
    };
    write_all(&dir, "ticket", &[ticket.encode().to_vec()])?;
    // The state target reads its first byte as a mode: 0 = a whole file, 1 = a body that the
    // target wraps in a valid header.
    let state_file = state::encode(&group());
    let mut whole = vec![0u8];
    whole.extend_from_slice(&state_file);
    let mut body = vec![1u8];
    body.extend_from_slice(&state_file[STATE_HEADER_LEN..]);
    write_all(&dir, "state", &[whole, body])?;
    write_all(
        &dir,
        "manifest",
        &[manifest::encode(&manifest_for(&state_file))],
    )?;
    Ok(())
}
