//! The manifest decoder: an accepted manifest validates, re-encodes to a document that decodes to
//! the same manifest, and checking any state bytes against it is total too.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = manifest::decode(data) {
        m.validate().unwrap();
        assert_eq!(manifest::decode(&manifest::encode(&m)).unwrap(), m);
        let _ = m.verify_state(data);
    }
});
