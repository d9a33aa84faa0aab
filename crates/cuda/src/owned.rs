//! Driver objects that clean up on drop. A cleanup that fails cannot be returned from `drop`; it
//! is reported through the `on_error` hook each owner keeps (the shim logs), never silently lost.

use crate::{CudaError, DriverHandle, DriverTable};
use core::ffi::c_void;
use cuda_abi::{CUdevice, CUdeviceptr, CUmemAccessDesc, CUstream};

/// Where a failed cleanup goes.
pub type OnError = fn(&CudaError);

/// A device's primary context, retained and current on this thread; on drop the thread is left
/// with no current context and the retain is released.
#[derive(Debug)]
pub struct PrimaryContext<'a> {
    driver: &'a DriverTable,
    device: CUdevice,
    on_error: OnError,
}

impl<'a> PrimaryContext<'a> {
    /// Retains `device`'s primary context and makes it current.
    pub fn enter(
        driver: &'a DriverTable,
        device: CUdevice,
        on_error: OnError,
    ) -> Result<PrimaryContext<'a>, CudaError> {
        let ctx = driver.primary_ctx_retain(device)?;
        if let Err(e) = driver.ctx_set_current(ctx) {
            if let Err(undo) = driver.primary_ctx_release(device) {
                on_error(&undo);
            }
            return Err(e);
        }
        Ok(PrimaryContext {
            driver,
            device,
            on_error,
        })
    }

    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// Leaves the context current and retained for the life of the thread (a workload that
    /// works in it from here on).
    pub fn keep(self) {
        core::mem::forget(self);
    }
}

impl Drop for PrimaryContext<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.driver.ctx_set_current(core::ptr::null_mut()) {
            (self.on_error)(&e);
        }
        if let Err(e) = self.driver.primary_ctx_release(self.device) {
            (self.on_error)(&e);
        }
    }
}

/// A VA range reserved and one allocation mapped over all of it with access granted; on drop it
/// is unmapped and the range freed. Used for the shim's own temporary mappings.
#[derive(Debug)]
pub struct Mapping<'a> {
    driver: &'a DriverTable,
    va: CUdeviceptr,
    size: usize,
    on_error: OnError,
}

impl<'a> Mapping<'a> {
    /// Reserves `size` bytes anywhere, maps `handle` at offset 0 over them and grants `access`.
    pub fn whole(
        driver: &'a DriverTable,
        handle: DriverHandle,
        size: usize,
        access: &[CUmemAccessDesc],
        on_error: OnError,
    ) -> Result<Mapping<'a>, CudaError> {
        let va = driver.mem_address_reserve(size, 0, 0, 0)?;
        if let Err(e) = driver.mem_map(va, size, 0, handle, 0) {
            if let Err(undo) = driver.mem_address_free(va, size) {
                on_error(&undo);
            }
            return Err(e);
        }
        // From here the drop undoes both steps.
        let mapping = Mapping {
            driver,
            va,
            size,
            on_error,
        };
        driver.mem_set_access(va, size, access)?;
        Ok(mapping)
    }

    pub fn va(&self) -> CUdeviceptr {
        self.va
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Keeps the mapping for the life of the process (a copy into it may still be running).
    pub fn leak(self) {
        core::mem::forget(self);
    }
}

impl Drop for Mapping<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.driver.mem_unmap(self.va, self.size) {
            (self.on_error)(&e);
        }
        if let Err(e) = self.driver.mem_address_free(self.va, self.size) {
            (self.on_error)(&e);
        }
    }
}

/// A stream of the current context, destroyed on drop.
#[derive(Debug)]
pub struct Stream<'a> {
    driver: &'a DriverTable,
    stream: CUstream,
    on_error: OnError,
}

impl<'a> Stream<'a> {
    /// `cuStreamCreate` with `flags`.
    pub fn new(
        driver: &'a DriverTable,
        flags: u32,
        on_error: OnError,
    ) -> Result<Stream<'a>, CudaError> {
        let mut stream: CUstream = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { driver.cuStreamCreate(&mut stream, flags) }?;
        Ok(Stream {
            driver,
            stream,
            on_error,
        })
    }

    /// The stream's handle, for the asynchronous copies.
    pub fn raw(&self) -> CUstream {
        self.stream
    }

    /// `cuStreamSynchronize`.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: our stream, passed by value.
        unsafe { self.driver.cuStreamSynchronize(self.stream) }
    }

    /// Keeps the stream (work on it could not be confirmed finished).
    pub fn leak(self) {
        core::mem::forget(self);
    }
}

impl Drop for Stream<'_> {
    fn drop(&mut self) {
        // SAFETY: our stream; the owner synchronised it or leaked it instead of dropping.
        if let Err(e) = unsafe { self.driver.cuStreamDestroy_v2(self.stream) } {
            (self.on_error)(&e);
        }
    }
}

/// Page-locked host memory from `cuMemHostAlloc`, freed on drop.
#[derive(Debug)]
pub struct PinnedBuffer<'a> {
    driver: &'a DriverTable,
    ptr: *mut u8,
    len: usize,
    on_error: OnError,
}

impl<'a> PinnedBuffer<'a> {
    /// `cuMemHostAlloc(len, flags)`.
    pub fn new(
        driver: &'a DriverTable,
        len: usize,
        flags: u32,
        on_error: OnError,
    ) -> Result<PinnedBuffer<'a>, CudaError> {
        let mut p: *mut c_void = core::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        unsafe { driver.cuMemHostAlloc(&mut p, len, flags) }?;
        if p.is_null() {
            return Err(CudaError {
                call: "cuMemHostAlloc",
                result: cuda_abi::CUresult::ERROR_OUT_OF_MEMORY,
            });
        }
        Ok(PinnedBuffer {
            driver,
            ptr: p.cast(),
            len,
            on_error,
        })
    }

    /// The buffer's address, for asynchronous copies (whose user keeps the buffer alive and
    /// unaliased until the copy is synchronised).
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// The buffer as bytes, for synchronous copies and CPU access.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is our own `cuMemHostAlloc` allocation of `len` bytes, alive until drop;
        // `&mut self` excludes every other safe access, and a user of `as_mut_ptr` for an
        // asynchronous copy synchronises it before the buffer is used again (its own unsafe
        // contract), so no DMA writes it while the slice lives.
        unsafe { core::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the buffer for the life of the process (a copy into it may still be running).
    pub fn leak(self) {
        core::mem::forget(self);
    }
}

impl Drop for PinnedBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: our buffer; every copy on it is synchronised (else the owner leaks it).
        if let Err(e) = unsafe { self.driver.cuMemFreeHost(self.ptr.cast()) } {
            (self.on_error)(&e);
        }
    }
}
