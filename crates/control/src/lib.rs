//! What the cuinterpose tool does: discovery, preflight, phase driving, native checkpoint, CRIU
