//! The state-file decoder. The first input byte picks what the rest is: even = a whole file (the
//! envelope checks get fuzzed), odd = a body, wrapped here in a valid header with a matching length
//! and checksum (the postcard decoder, the canonical check and the validation get fuzzed, which a
//! random checksum would almost never let through). An accepted file re-encodes to exactly the
//! input and validates.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::state::{self, STATE_MAGIC, STATE_VERSION};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut file = Vec::with_capacity(24 + rest.len());
        file.extend_from_slice(&STATE_MAGIC);
        file.extend_from_slice(&STATE_VERSION.to_le_bytes());
        file.extend_from_slice(&0u16.to_le_bytes());
        file.extend_from_slice(&(rest.len() as u64).to_le_bytes());
        file.extend_from_slice(&crc32(rest).to_le_bytes());
        file.extend_from_slice(rest);
        file
    };
    if let Ok(group) = state::decode(&file) {
        assert_eq!(state::encode(&group), file);
        group.validate().unwrap();
    }
});

/// CRC-32 (IEEE), bitwise, independent of the implementation under test.
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
