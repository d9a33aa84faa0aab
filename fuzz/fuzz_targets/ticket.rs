//! The ticket codec: an accepted ticket re-encodes to exactly the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use protocol::ticket::Ticket;

fuzz_target!(|data: &[u8]| {
    if let Ok(ticket) = Ticket::decode(data) {
        assert_eq!(&ticket.encode()[..], data);
    }
});
