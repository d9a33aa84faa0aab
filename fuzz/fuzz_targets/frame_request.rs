//! A request frame as the transport reads it: the header, then the body it announces. An accepted
//! request re-encodes to a frame that decodes to the same request.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::message::{FrameHeader, HEADER_LEN, decode_request, encode_request};

fuzz_target!(|data: &[u8]| {
    let Some((header, body)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    let Ok(header) = FrameHeader::decode(header) else {
        return;
    };
    let Ok(request) = decode_request(&header, body) else {
        return;
    };
    assert_eq!(request.kind(), header.kind);
    let again = encode_request(&request);
    let (h, b) = again.split_first_chunk::<HEADER_LEN>().unwrap();
    let h = FrameHeader::decode(h).unwrap();
    assert_eq!(decode_request(&h, b).unwrap(), request);
});
