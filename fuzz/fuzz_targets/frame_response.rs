//! A response frame as the transport reads it: the header, then the body it announces. An accepted
//! response re-encodes to a frame that decodes to the same response.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::message::{FrameHeader, HEADER_LEN, decode_response, encode_response};

fuzz_target!(|data: &[u8]| {
    let Some((header, body)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(header) = FrameHeader::decode(header) else {
        return;
    };
    let Ok(response) = decode_response(&header, body) else {
        return;
    };
    assert_eq!(response.kind(), header.kind);
    let again = encode_response(&response);
    let (h, b) = again.split_first_chunk::<HEADER_LEN>().unwrap();
    let h = FrameHeader::decode(h).unwrap();
    assert_eq!(decode_response(&h, b).unwrap(), response);
});
