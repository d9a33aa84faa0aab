//! Framed Unix-socket transport of cuinterpose: bounded frames carrying at most one descriptor.

#![forbid(unsafe_code)]
