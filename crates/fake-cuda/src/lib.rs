//! A CUDA driver (libcuda.so.1) without a GPU, faithful to r580, for tests
