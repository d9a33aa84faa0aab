//! The cuinterpose command-line tool
fn main() {}
