//! Every decoder is total: fed thousands of deterministic pseudo-random and mutated inputs, each
//! returns `Ok` or `Err` and never panics; an `Ok` re-encodes to the identical bytes where the
//! format is canonical (ticket, state file) and to an equal value where it is not (frame bodies,
//! whose postcard integers may be over-long; the manifest, whose JSON may be spaced differently).
//!
//! The same oracles run under libFuzzer in `fuzz/`; this test keeps them exercised on stable.

mod common;

use common::{group, manifest_for, requests, responses};
use cuinterpose_protocol::ipc::{IPC_HANDLE_LEN, IpcHandle};
use cuinterpose_protocol::manifest;
use cuinterpose_protocol::message::{self, FrameHeader, HEADER_LEN};
use cuinterpose_protocol::state::{self, STATE_HEADER_LEN};
use cuinterpose_protocol::ticket::{TICKET_LEN, Ticket};
use cuinterpose_protocol::*;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let len = self.below(max_len + 1);
        (0..len).map(|_| self.byte()).collect()
    }
}

/// One random mutation (or a few stacked) of `seed`.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..=rng.below(3) {
        let len = out.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                out[i] = rng.byte();
            }
            2 if len > 0 => {
                // Interesting values at a random place.
                let i = rng.below(len);
                let v = [0x00, 0x01, 0x7f, 0x80, 0xff][rng.below(5)];
                out[i] = v;
            }
            3 => out.truncate(rng.below(len + 1)),
            4 => {
                let extra = rng.bytes(16);
                let at = rng.below(len + 1);
                out.splice(at..at, extra);
            }
            5 if len > 0 => {
                let from = rng.below(len);
                let to = (from + 1 + rng.below(16)).min(len);
                out.drain(from..to);
            }
            6 if len > 1 => {
                // Duplicate a chunk somewhere else.
                let from = rng.below(len);
                let to = (from + 1 + rng.below(32)).min(len);
                let chunk = out[from..to].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(at..at, chunk);
            }
            7 if len >= 8 => {
                // Overwrite a little-endian integer with an extreme.
                let i = rng.below(len - 7);
                let v: u64 = [0, 1, u64::MAX, u64::from(u32::MAX), 1 << 31][rng.below(5)];
                let w = [2, 4, 8][rng.below(3)];
                out[i..i + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            _ => out.push(rng.byte()),
        }
    }
    out
}

/// Decodes a whole frame the way the transport does: header first, then the body it announces.
fn check_frame(bytes: &[u8], as_request: bool) -> bool {
    let Some((header, body)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return false;
    };
    let Ok(header) = FrameHeader::decode(header) else {
        return false;
    };
    assert!(header.length <= message::MAX_BODY_LEN);
    if as_request {
        let Ok(request) = message::decode_request(&header, body) else {
            return false;
        };
        assert_eq!(request.kind(), header.kind);
        let again = message::encode_request(&request);
        let (h, b) = again.split_at(HEADER_LEN);
        let h = FrameHeader::decode(h.try_into().unwrap()).unwrap();
        assert_eq!(message::decode_request(&h, b).unwrap(), request);
    } else {
        let Ok(response) = message::decode_response(&header, body) else {
            return false;
        };
        assert_eq!(response.kind(), header.kind);
        let again = message::encode_response(&response);
        let (h, b) = again.split_at(HEADER_LEN);
        let h = FrameHeader::decode(h.try_into().unwrap()).unwrap();
        assert_eq!(message::decode_response(&h, b).unwrap(), response);
    }
    true
}

/// Rewrites a frame's length field to what follows the header, so that mutations of the body
/// reach the body decoder instead of the length check.
fn fix_frame_length(mut frame: Vec<u8>) -> Vec<u8> {
    if frame.len() >= HEADER_LEN {
        let len = (frame.len() - HEADER_LEN) as u32;
        frame[8..12].copy_from_slice(&len.to_le_bytes());
    }
    frame
}

fn check_ticket(bytes: &[u8]) -> bool {
    match Ticket::decode(bytes) {
        Ok(ticket) => {
            assert_eq!(ticket.encode()[..], bytes[..]);
            true
        }
        Err(_) => false,
    }
}

fn fix_ticket_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() == TICKET_LEN {
        let crc = crc32(&bytes[..40]);
        bytes[40..44].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

fn check_ipc_handle(bytes: &[u8]) -> bool {
    match IpcHandle::decode(bytes) {
        Ok(handle) => {
            assert_eq!(handle.encode()[..], bytes[..]);
            true
        }
        Err(_) => false,
    }
}

fn fix_ipc_crc(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() == IPC_HANDLE_LEN {
        let crc = crc32(&bytes[..56]);
        bytes[56..60].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

fn check_state(bytes: &[u8]) -> bool {
    match state::decode(bytes) {
        Ok(group) => {
            assert_eq!(state::encode(&group), bytes);
            group.validate().unwrap();
            true
        }
        Err(_) => false,
    }
}

/// Rewrites length and checksum to fit the (mutated) body, so that the body decoder and the
/// validation are what gets exercised.
fn fix_state_envelope(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() >= STATE_HEADER_LEN {
        let body_len = (bytes.len() - STATE_HEADER_LEN) as u64;
        bytes[12..20].copy_from_slice(&body_len.to_le_bytes());
        let crc = crc32(&bytes[STATE_HEADER_LEN..]);
        bytes[20..24].copy_from_slice(&crc.to_le_bytes());
    }
    bytes
}

fn check_manifest(bytes: &[u8]) -> bool {
    match manifest::decode(bytes) {
        Ok(m) => {
            m.validate().unwrap();
            assert_eq!(manifest::decode(&manifest::encode(&m)).unwrap(), m);
            true
        }
        Err(_) => false,
    }
}

/// CRC-32 (IEEE), bitwise: the test must not share the implementation it checks.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Structural mutation of a JSON document: replace, remove or add at a random node.
fn mutate_json(rng: &mut Rng, node: &mut serde_json::Value, depth: usize) {
    use serde_json::Value;
    if depth > 0 && rng.below(4) != 0 {
        let child = match node {
            Value::Object(map) if !map.is_empty() => {
                let i = rng.below(map.len());
                map.values_mut().nth(i)
            }
            Value::Array(items) if !items.is_empty() => {
                let i = rng.below(items.len());
                items.get_mut(i)
            }
            _ => None,
        };
        if let Some(child) = child {
            return mutate_json(rng, child, depth - 1);
        }
    }
    let replacement = match rng.below(8) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => Value::from(rng.next()),
        3 => Value::from(-(rng.below(1000) as i64)),
        4 => Value::from(0.5),
        5 => Value::from(""),
        6 => Value::from("0f".repeat(32)),
        _ => Value::Array(vec![]),
    };
    match (rng.below(3), node) {
        (0, Value::Object(map)) if !map.is_empty() => {
            let k = map.keys().nth(rng.below(map.len())).cloned();
            if let Some(k) = k {
                map.remove(&k);
            }
        }
        (1, Value::Object(map)) => {
            map.insert("unexpected".into(), replacement);
        }
        (1, Value::Array(items)) if !items.is_empty() => {
            let dup = items[rng.below(items.len())].clone();
            items.push(dup);
        }
        (_, node) => *node = replacement,
    }
}

const ROUNDS: usize = 4000;

#[test]
fn frame_decoders_are_total() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for (seeds, as_request) in [
        (
            requests()
                .iter()
                .map(message::encode_request)
                .collect::<Vec<_>>(),
            true,
        ),
        (
            responses().iter().map(message::encode_response).collect(),
            false,
        ),
    ] {
        for seed in &seeds {
            assert!(check_frame(seed, as_request), "a seed was refused");
        }
        for _ in 0..ROUNDS {
            let seed = &seeds[rng.below(seeds.len())];
            let input = match rng.below(4) {
                0 => rng.bytes(64),
                1 => mutate(&mut rng, seed),
                _ => fix_frame_length(mutate(&mut rng, seed)),
            };
            accepted += usize::from(check_frame(&input, as_request));
            // The other decoder must be total on the same bytes too.
            check_frame(&input, !as_request);
        }
    }
    eprintln!("frames: {accepted} mutated inputs accepted");
}

#[test]
fn ticket_decoder_is_total() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let seed = Ticket {
        creator_ns_pid: 41,
        id: AllocationId([0x5a; 16]),
        size: 2 << 20,
        multicast: false,
    }
    .encode();
    assert!(check_ticket(&seed));
    let mut accepted = 0;
    for _ in 0..ROUNDS * 2 {
        let input = match rng.below(4) {
            0 => rng.bytes(2 * TICKET_LEN),
            1 => mutate(&mut rng, &seed),
            _ => fix_ticket_crc(mutate(&mut rng, &seed)),
        };
        accepted += usize::from(check_ticket(&input));
    }
    // With the checksum rewritten, changes of the payload fields are accepted and re-encode
    // identically; the refusals are covered by the unit tests.
    assert!(accepted > 0);
    eprintln!("tickets: {accepted} mutated inputs accepted");
}

#[test]
fn ipc_handle_decoder_is_total() {
    let mut rng = Rng(0x1bc0_ffee_d00d_5eed);
    let seed = IpcHandle {
        creator_ns_pid: 41,
        id: AllocationId([0x5a; 16]),
        offset: 0x100,
        requested: 3 << 20,
        backing: 4 << 20,
    }
    .encode();
    assert!(check_ipc_handle(&seed));
    let mut accepted = 0;
    for _ in 0..ROUNDS * 2 {
        let input = match rng.below(4) {
            0 => rng.bytes(2 * IPC_HANDLE_LEN),
            1 => mutate(&mut rng, &seed),
            _ => fix_ipc_crc(mutate(&mut rng, &seed)),
        };
        accepted += usize::from(check_ipc_handle(&input));
    }
    // As for tickets: payload changes under a rewritten checksum are accepted and re-encode
    // identically (when the sizes stay consistent); the refusals are the unit tests'.
    assert!(accepted > 0);
    eprintln!("IPC handles: {accepted} mutated inputs accepted");
}

#[test]
fn state_decoder_is_total() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let seed = state::encode(&group());
    assert!(check_state(&seed));
    let mut accepted = 0;
    for _ in 0..ROUNDS {
        let input = match rng.below(4) {
            0 => rng.bytes(128),
            1 => mutate(&mut rng, &seed),
            _ => fix_state_envelope(mutate(&mut rng, &seed)),
        };
        accepted += usize::from(check_state(&input));
    }
    eprintln!("state: {accepted} mutated inputs accepted");
}

#[test]
fn manifest_decoder_is_total() {
    let mut rng = Rng(0xfeed_face_0bad_f00d);
    let state_file = state::encode(&group());
    let good = manifest_for(&state_file);
    good.verify_state(&state_file).unwrap();
    let seed = manifest::encode(&good);
    assert!(check_manifest(&seed));
    let seed_value: serde_json::Value = serde_json::from_slice(&seed).unwrap();
    let mut accepted = 0;
    for _ in 0..ROUNDS {
        let input = match rng.below(3) {
            0 => mutate(&mut rng, &seed),
            _ => {
                let mut v = seed_value.clone();
                for _ in 0..=rng.below(2) {
                    mutate_json(&mut rng, &mut v, 4);
                }
                serde_json::to_vec(&v).unwrap()
            }
        };
        if check_manifest(&input) {
            accepted += 1;
            // An accepted manifest's state check is total as well.
            let m = manifest::decode(&input).unwrap();
            let _ = m.verify_state(&state_file);
        }
    }
    eprintln!("manifest: {accepted} mutated inputs accepted");
}
