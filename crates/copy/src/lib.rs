//! The copy engine: host carriers and the workers that move device memory into and out of them
//! ([`engine`], re-exported here), the carrier helper's server that runs the same engine in a
//! process of its own ([`carrier_helper`], `cuinterpose carrier-helper`), and the logger both
//! write through ([`log`]).
//!
//! A crate of its own so that the tool, which only starts the carrier helper, links the engine
//! and not the interposer's runtime (registry, phases, control server) that also uses it.
//!
//! Unsafe code is denied here except in [`engine`] and [`ring`]: the carriers, the staging
//! buffers and the data-file workers' buffers are raw host memory that DMA reads and writes
//! while a copy runs (their docs say why each part must be unsafe).

#![deny(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub mod carrier_helper;
pub mod direct_io;
pub mod engine;
pub mod log;
pub mod ring;

pub use engine::{
    Carrier, CarrierMode, CarrierPolicy, CarrierRelease, CarrierView, CopyConfig, CopyError,
    CopyStats, DEFAULT_CHUNK, DeviceContext, Direction, PIN_PIECE, SEGMENT, Unit, copy_all, enter,
    log_cleanup, segments, workers_per_device,
};
