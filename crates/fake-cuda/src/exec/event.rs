//! Events: a record captures where its stream's queue stands (how much work was queued); the
//! event is reached once that work is complete, or discarded (its context went, the process
//! faulted, the queue is gone). `cuStreamWaitEvent` queues a wait for that point.

use std::ffi::c_uint;

use cuda_abi::{CUevent, CUresult, CUstream};

use super::{Work, enqueue, reached, record_point, wait_idle};
use crate::device::current;
use crate::state::{self, Driver};
use crate::{Res, write_out};

/// Base of event handle values (opaque to the application, never dereferenced).
const EVENT_BASE: u64 = 0x00e7_e000_0000;
/// CU_EVENT_BLOCKING_SYNC | DISABLE_TIMING | INTERPROCESS: accepted, nothing to model.
const EVENT_FLAGS: c_uint = 0x7;
/// CU_EVENT_RECORD_EXTERNAL / CU_EVENT_WAIT_EXTERNAL (meaningful in graphs only).
const EXTERNAL: c_uint = 0x1;

#[derive(Debug)]
pub(crate) struct Event {
    pub ctx: u64,
    /// The queue and ticket of the last record (`None`: never recorded, which counts as
    /// reached, as on the driver).
    record: Option<(u64, u64)>,
}

fn event_id(d: &Driver, event: CUevent) -> Res<u64> {
    let v = event as usize as u64;
    (v > EVENT_BASE && (v - EVENT_BASE).is_multiple_of(0x10))
        .then(|| (v - EVENT_BASE) / 0x10)
        .filter(|id| d.exec.events.contains_key(id))
        .ok_or(CUresult::ERROR_INVALID_HANDLE)
}

fn event_reached(d: &Driver, id: u64) -> bool {
    d.exec
        .events
        .get(&id)
        .and_then(|e| e.record)
        .is_none_or(|(qid, ticket)| reached(d, qid, ticket))
}

pub(crate) unsafe fn create(event: *mut CUevent, flags: c_uint) -> Res {
    if event.is_null() || flags & !EVENT_FLAGS != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let id = state::with(|d| {
        let (ctx, _) = current(d)?;
        let id = d.next_id();
        d.exec.events.insert(id, Event { ctx, record: None });
        Ok(id)
    })?;
    // SAFETY: checked non-null; the caller passes a writable CUevent.
    unsafe { write_out(event, (EVENT_BASE + id * 0x10) as usize as CUevent) }
}

/// `cuEventDestroy_v2`: at once, even if the recorded work is not complete (as on the driver).
pub(crate) fn destroy(event: CUevent) -> Res {
    state::with(|d| {
        let id = event_id(d, event)?;
        d.exec.events.remove(&id);
        Ok(())
    })
}

pub(crate) fn record(event: CUevent, stream: CUstream, flags: c_uint) -> Res {
    if flags & !EXTERNAL != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        let id = event_id(d, event)?;
        let point = record_point(d, stream)?;
        if let Some(e) = d.exec.events.get_mut(&id) {
            e.record = Some(point);
        }
        state::notify();
        Ok(())
    })
}

pub(crate) fn query(event: CUevent) -> Res {
    state::with(|d| {
        let id = event_id(d, event)?;
        if event_reached(d, id) {
            Ok(())
        } else {
            Err(CUresult::ERROR_NOT_READY)
        }
    })
}

pub(crate) fn synchronize(event: CUevent) -> Res {
    wait_idle(None, |d| {
        let id = event_id(d, event)?;
        Ok(!event_reached(d, id))
    })
}

/// `cuStreamWaitEvent`: later work on `stream` starts once the event's recorded work is
/// complete (nothing to wait for if it was never recorded).
pub(crate) fn stream_wait_event(stream: CUstream, event: CUevent, flags: c_uint) -> Res {
    if flags & !EXTERNAL != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    state::with(|d| {
        let id = event_id(d, event)?;
        crate::device::check_stream(d, stream)?;
        match d.exec.events.get(&id).and_then(|e| e.record) {
            Some((queue, ticket)) if !reached(d, queue, ticket) => {
                enqueue(d, stream, Work::WaitEvent { queue, ticket })
            }
            _ => Ok(()),
        }
    })
}
