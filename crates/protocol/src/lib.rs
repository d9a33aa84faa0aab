//! Control messages, records, tickets, state-file and manifest formats of cuinterpose (no I/O)
