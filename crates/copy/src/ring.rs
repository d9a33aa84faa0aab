//! Two pinned buffers that a data-file worker fills in turn while the device copies the other
//! one out, each copy asynchronous on a non-blocking stream of its own.
//!
//! A worker that reads a block, hashes it and then waits for a synchronous `cuMemcpyHtoD` leaves
//! the copy engine idle while it reads and hashes, and itself idle while the engine copies; and
//! synchronous copies of every thread of a process queue on the context's legacy stream. On the
//! H100 machine 16 threads reading and hashing 2 MiB blocks from tmpfs ran at 38.7 GB/s, and at
//! 21.7 GB/s once each waited for its copy (docs/measurements.md, 2026-12-07). Here a buffer's
//! copies are queued on its own stream and the worker goes on filling the other buffer; it waits
//! only when it comes back to a buffer whose copies have not finished.
//!
//! Unsafe code is allowed in this module: the device reads a buffer by DMA after the call that
//! queued the copy returned; [`Filling`] hands out only the part of a buffer no queued copy
//! reads, and a buffer whose copies could not be confirmed finished is leaked, never freed.
#![allow(unsafe_code)]

use crate::engine::{CopyError, log_cleanup};
use cuda::DriverTable as Real;
use cuda::owned::{PinnedBuffer, Stream};

/// `CU_STREAM_NON_BLOCKING`: the copies never wait for the application's legacy stream.
const STREAM_NON_BLOCKING: u32 = 1;

/// One buffer and the stream its copies run on.
#[derive(Debug)]
struct Slot<'a> {
    buffer: PinnedBuffer<'a>,
    stream: Stream<'a>,
    /// Copies were queued since the stream was last synchronised.
    busy: bool,
}

/// Two buffers of the same size on the current context's device (entered by the caller, and
/// current whenever the ring is used and dropped).
#[derive(Debug)]
pub struct PinnedRing<'a> {
    real: &'a Real,
    device: i32,
    slots: Vec<Slot<'a>>,
    next: usize,
}

impl<'a> PinnedRing<'a> {
    /// Two pinned buffers of `len` bytes and their streams, for the current context (that of
    /// `device`).
    pub fn new(real: &'a Real, device: i32, len: usize) -> Result<PinnedRing<'a>, CopyError> {
        let driver = |e: cuda::CudaError| CopyError::Driver {
            call: e.call,
            device,
            result: e.result,
        };
        let mut slots = Vec::with_capacity(2);
        for _ in 0..2 {
            slots.push(Slot {
                buffer: PinnedBuffer::new(real, len, 0, log_cleanup).map_err(driver)?,
                stream: Stream::new(real, STREAM_NON_BLOCKING, log_cleanup).map_err(driver)?,
                busy: false,
            });
        }
        Ok(PinnedRing {
            real,
            device,
            slots,
            next: 0,
        })
    }

    /// The buffer to use next, in turn (what [`PinnedRing::receive`] and
    /// [`PinnedRing::filling`] take).
    pub fn next_slot(&mut self) -> usize {
        let slot = self.next;
        self.next = (self.next + 1) % self.slots.len();
        slot
    }

    fn slot(&mut self, slot: usize) -> Result<&mut Slot<'a>, CopyError> {
        let device = self.device;
        self.slots.get_mut(slot).ok_or(CopyError::Driver {
            call: "PinnedRing::slot",
            device,
            result: cuda_abi::CUresult::ERROR_INVALID_VALUE,
        })
    }

    /// Buffer `slot` to fill, once the copies queued into or out of it have finished.
    pub fn filling(&mut self, slot: usize) -> Result<Filling<'_, 'a>, CopyError> {
        let device = self.device;
        let slot = self.slot(slot)?;
        wait(slot, device)?;
        Ok(Filling {
            slot,
            device,
            sent_to: 0,
        })
    }

    /// Queues the copy of `len` bytes at `dev` into the start of buffer `slot`, asynchronously,
    /// once the copies queued before have finished: [`PinnedRing::filling`] of the slot waits for
    /// it, so the worker can do other work while the device copies.
    pub fn receive(&mut self, slot: usize, dev: u64, len: usize) -> Result<(), CopyError> {
        let (real, device) = (self.real, self.device);
        let slot = self.slot(slot)?;
        wait(slot, device)?;
        let invalid = CopyError::Driver {
            call: "cuMemcpyDtoHAsync",
            device,
            result: cuda_abi::CUresult::ERROR_INVALID_VALUE,
        };
        if len > slot.buffer.len() {
            return Err(invalid);
        }
        let dst = slot.buffer.as_mut_ptr();
        // SAFETY: the first `len` bytes of the buffer (checked above), which nothing reads or
        // writes until the stream is synchronised: the buffer is handed out only by `filling`,
        // which waits for it first, and is neither freed nor reused before that (drop leaks it
        // when the wait fails).
        let r = unsafe { (real.cuMemcpyDtoHAsync_v2)(dst.cast(), dev, len, slot.stream.raw()) };
        slot.busy = true;
        if !r.is_success() {
            return Err(CopyError::Driver {
                call: "cuMemcpyDtoHAsync",
                device,
                result: r,
            });
        }
        Ok(())
    }

    /// Waits for every queued copy: when it returns, the device holds every byte sent.
    pub fn finish(&mut self) -> Result<(), CopyError> {
        let device = self.device;
        self.slots
            .iter_mut()
            .try_for_each(|slot| wait(slot, device))
    }
}

/// Synchronises the slot's stream if copies were queued on it.
fn wait(slot: &mut Slot<'_>, device: i32) -> Result<(), CopyError> {
    if slot.busy {
        slot.stream.synchronize().map_err(|e| CopyError::Driver {
            call: e.call,
            device,
            result: e.result,
        })?;
        slot.busy = false;
    }
    Ok(())
}

impl Drop for PinnedRing<'_> {
    fn drop(&mut self) {
        for slot in self.slots.drain(..) {
            if slot.busy && slot.stream.synchronize().is_err() {
                // A copy may still read the buffer: keep both for the life of the process.
                slot.buffer.leak();
                slot.stream.leak();
            }
        }
    }
}

/// A buffer being filled: its bytes are handed out from where the last queued copy ended, so
/// nothing the device may still be reading is ever written.
#[derive(Debug)]
pub struct Filling<'r, 'a> {
    slot: &'r mut Slot<'a>,
    device: i32,
    /// Bytes before this offset have been queued for the device.
    sent_to: usize,
}

impl Filling<'_, '_> {
    /// The bytes `[at, at + len)` of the buffer, to fill; `None` if they are not all past the
    /// last queued copy, or past the buffer.
    pub fn bytes(&mut self, at: usize, len: usize) -> Option<&mut [u8]> {
        if at < self.sent_to {
            return None;
        }
        self.slot
            .buffer
            .as_mut_slice()
            .get_mut(at..at.checked_add(len)?)
    }

    /// The first `len` bytes of the buffer, to read (a copy queued from them only reads them
    /// too).
    pub fn filled(&mut self, len: usize) -> Option<&[u8]> {
        self.slot.buffer.as_mut_slice().get(..len)
    }

    /// Queues the copy of `[at, at + len)` of the buffer to `dev`, asynchronously. Nothing of the
    /// buffer before `at + len` is handed out again until the copy has finished.
    pub fn send(&mut self, real: &Real, at: usize, len: usize, dev: u64) -> Result<(), CopyError> {
        let invalid = || CopyError::Driver {
            call: "cuMemcpyHtoDAsync",
            device: self.device,
            result: cuda_abi::CUresult::ERROR_INVALID_VALUE,
        };
        let end = at.checked_add(len).ok_or_else(invalid)?;
        if at < self.sent_to || end > self.slot.buffer.len() {
            return Err(invalid());
        }
        let src = self.slot.buffer.as_mut_ptr().wrapping_add(at);
        // SAFETY: `[at, end)` lies inside the buffer (checked above). From here on the buffer
        // is not written before `end` (`bytes` refuses it) and is neither freed nor handed out
        // again before its stream is synchronised (`PinnedRing::fill`, `finish`, drop, which
        // leaks it when that fails), so the bytes stay put while the DMA reads them.
        let r =
            unsafe { (real.cuMemcpyHtoDAsync_v2)(dev, src.cast(), len, self.slot.stream.raw()) };
        self.slot.busy = true;
        self.sent_to = end;
        if !r.is_success() {
            return Err(CopyError::Driver {
                call: "cuMemcpyHtoDAsync",
                device: self.device,
                result: r,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_fills_one_buffer_while_the_other_is_copied_and_never_writes_what_is_queued() {
        let real = &testdriver::real();
        let _context = crate::enter(real, 0).expect("context");
        let len = 64 << 10;
        let prop = cuda_abi::CUmemAllocationProp {
            type_: cuda_abi::allocation_type::PINNED,
            location: cuda_abi::CUmemLocation {
                type_: cuda_abi::location_type::DEVICE,
                id: 0,
            },
            ..Default::default()
        };
        let handle = real.mem_create(4 * len, &prop, 0).expect("device memory");
        let dev = real.mem_address_reserve(4 * len, 0, 0, 0).expect("reserve");
        real.mem_map(dev, 4 * len, 0, handle, 0).expect("map");
        let mut ring = PinnedRing::new(real, 0, len).expect("ring");
        for unit in 0..4u8 {
            let slot = ring.next_slot();
            let mut filling = ring.filling(slot).expect("a buffer");
            // Two halves, each queued as soon as it is filled.
            for half in 0..2usize {
                let at = half * len / 2;
                filling
                    .bytes(at, len / 2)
                    .expect("unqueued bytes")
                    .fill(unit * 2 + half as u8 + 1);
                let target = dev + (usize::from(unit) * len + at) as u64;
                filling.send(real, at, len / 2, target).expect("queued");
            }
            // What is queued is handed out again only to read.
            assert!(filling.bytes(0, 1).is_none());
            assert!(filling.bytes(len / 2, 1).is_none());
            assert_eq!(filling.filled(1), Some(&[unit * 2 + 1][..]));
            // Past the buffer: refused, nothing queued.
            assert!(filling.send(real, len, 1, dev).is_err());
        }
        ring.finish().expect("every copy done");
        let mut back = vec![0u8; 4 * len];
        real.memcpy_dtoh(&mut back, dev).expect("read back");
        for (i, chunk) in back.chunks(len / 2).enumerate() {
            assert!(chunk.iter().all(|&b| b == i as u8 + 1), "half {i}");
        }

        // The other way (a save): each unit received ahead into the next buffer in turn, found
        // there once its buffer is handed out.
        for unit in 0..4usize {
            let slot = ring.next_slot();
            ring.receive(slot, dev + (unit * len) as u64, len)
                .expect("queued");
            let mut filling = ring.filling(slot).expect("received");
            let bytes = filling.bytes(0, len).expect("the whole buffer");
            assert!(bytes[..len / 2].iter().all(|&b| b == unit as u8 * 2 + 1));
            assert!(bytes[len / 2..].iter().all(|&b| b == unit as u8 * 2 + 2));
        }
        // More than a buffer holds: refused, nothing queued.
        let slot = ring.next_slot();
        assert!(ring.receive(slot, dev, len + 1).is_err());
        ring.finish().expect("nothing left in flight");
    }
}
