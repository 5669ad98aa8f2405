//! Events recorded on streams (what stream-ordered reuse waits for), and the cache that
//! spares a driver call per event.

use super::libcuda::{CUDA_ERROR_NOT_READY, CUDA_SUCCESS, Driver, check, driver, with_device};
use crate::error::Result;
use crate::prim::fork::lock;
use cudarc::driver::sys::{CUevent, CUstream};
use std::ffi::c_uint;
use std::sync::Mutex;

const CU_EVENT_DISABLE_TIMING: c_uint = 2;

/// Events kept for reuse, per device: creating one costs a driver call, recording one is
/// cheap, and stream-ordered reuse records one each time a chunk falls idle.
static EVENT_CACHE: Mutex<Vec<(i32, usize)>> = Mutex::new(Vec::new());
/// Events kept at most (beyond this they are destroyed).
const EVENT_CACHE_MAX: usize = 256;

fn cached_event(d: &Driver, device: i32) -> Result<usize> {
    {
        let mut c = lock(&EVENT_CACHE);
        if let Some(i) = c.iter().rposition(|&(dev, _)| dev == device) {
            return Ok(c.swap_remove(i).1);
        }
    }
    let mut ev: CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the device's context is current (caller).
    check(
        d,
        unsafe { (d.cuEventCreate)(&mut ev, CU_EVENT_DISABLE_TIMING) },
        "cuEventCreate",
    )?;
    Ok(ev as usize)
}

fn uncache_event(d: &Driver, device: i32, ev: usize) {
    let mut c = lock(&EVENT_CACHE);
    if c.len() < EVENT_CACHE_MAX {
        c.push((device, ev));
    } else {
        drop(c);
        // SAFETY: `ev` is a live event nobody else holds.
        unsafe { (d.cuEventDestroy_v2)(ev as CUevent) };
    }
}

/// An event recorded on a stream: what stream-ordered reuse waits for.
#[derive(Debug)]
pub struct Event {
    ev: usize,
    device: i32,
}

impl Event {
    /// Record an event on `stream` of `device` (events are reused from a cache).
    pub fn record(stream: usize, device: i32) -> Result<Event> {
        with_device(device.max(0), |d| {
            let ev = cached_event(d, device)?;
            // SAFETY: `ev` is a live event; the driver validates the stream.
            if let Err(e) = check(
                d,
                unsafe { (d.cuEventRecord)(ev as CUevent, stream as CUstream) },
                "cuEventRecord",
            ) {
                uncache_event(d, device, ev);
                return Err(e);
            }
            Ok(Event { ev, device })
        })
    }

    /// Whether all work before the event has finished.
    pub fn done(&self) -> Result<bool> {
        with_device(self.device.max(0), |d| {
            // SAFETY: `ev` is a live event.
            match unsafe { (d.cuEventQuery)(self.ev as CUevent) } {
                CUDA_SUCCESS => Ok(true),
                CUDA_ERROR_NOT_READY => Ok(false),
                rc => check(d, rc, "cuEventQuery").map(|_| false),
            }
        })
    }

    /// Block until the event completes.
    pub fn wait(&self) -> Result<()> {
        with_device(self.device.max(0), |d| {
            // SAFETY: `ev` is a live event.
            check(
                d,
                unsafe { (d.cuEventSynchronize)(self.ev as CUevent) },
                "cuEventSynchronize",
            )
        })
    }

    /// Make `stream` wait for the event on the device (no host wait).
    pub fn wait_on(&self, stream: usize) -> Result<()> {
        with_device(self.device.max(0), |d| {
            // SAFETY: live event; the driver validates the stream.
            check(
                d,
                unsafe { (d.cuStreamWaitEvent)(stream as CUstream, self.ev as CUevent, 0) },
                "cuStreamWaitEvent",
            )
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // A recorded event may be re-recorded at once: waiters already captured it.
            uncache_event(d, self.device, self.ev);
        }
    }
}

/// Fork: the event cache (late in the order: events are recorded under pool locks).
pub(crate) fn fork_lock_events(held: &mut crate::prim::fork::Held) {
    held.push(lock(&EVENT_CACHE));
}
