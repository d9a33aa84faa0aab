//! Scriptable CUDA test workloads and test helpers
