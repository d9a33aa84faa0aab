//! libcuinterpose.so: the interposer loaded into every CUDA process
