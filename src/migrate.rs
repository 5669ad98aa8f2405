//! Background migration of managed memory to the host, so that the host's first reads of a
//! large GPU-written range overlap its migration instead of waiting for it.
//!
//! `ump_host_access` (and `asnumpy`) of a large managed range synchronises the producing
//! stream, hands the range to one worker thread and returns: the worker prefetches it to the
//! host in pieces of [`PIECE`] on a stream of its own, while the caller reads. A page the
//! worker has not moved yet faults in on first touch (the GPUs this serves have concurrent
//! managed access), so reads are right whatever the worker's progress. Measured on the lent
//! H100 (2026-11-24, 1 GiB): a prefetch to the host issued from the reading thread returns
//! only after about 100 ms of the calling thread's time, so it must run on another thread;
//! with the worker, write + hand-over + read of every byte took 165-176 ms against 272 ms for
//! prefetch-then-read and 184 ms for a copy into pinned memory then the read.
//!
//! Nothing may prefetch or access a range while it is discarded (`cuMemDiscardBatchAsync`):
//! [`quiesce`] cancels the jobs over a range and waits for the piece in flight, and the pools
//! call it before they discard or prefetch a block to a device.
//!
//! The queue's lock is the last in the fork order; in a `fork()` child the worker does not
//! exist and the queue starts empty.

use crate::prim::cuda;
use crate::prim::fork::lock;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

/// Bytes the worker prefetches at a time: a cancelled job stops within one piece (about 2 ms
/// at the 19 GB/s managed memory migrates to the host).
const PIECE: usize = 32 << 20;

/// A range still to migrate.
struct Job {
    device: i32,
    next: usize,
    end: usize,
}

struct Queue {
    jobs: VecDeque<Job>,
    /// The piece being migrated now.
    busy: Option<(usize, usize)>,
    /// The worker's stream on each device it has used.
    streams: Vec<(i32, usize)>,
    /// Whether the worker thread runs.
    worker: bool,
    /// Bytes migrated by the worker so far.
    migrated: u64,
}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    jobs: VecDeque::new(),
    busy: None,
    streams: Vec::new(),
    worker: false,
    migrated: 0,
});
static CHANGED: Condvar = Condvar::new();

fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Migrate `[ptr, ptr+size)` (managed memory of `device`, whose producing work is done) to the
/// host in the background. Returns false when no worker could be started (the caller then
/// migrates it itself).
pub fn start(device: i32, ptr: usize, size: usize) -> bool {
    if crate::prim::fork::is_fork_child() {
        return false;
    }
    let mut q = lock(&QUEUE);
    if !q.worker {
        let spawned = std::thread::Builder::new()
            .name("ump-migrate".into())
            .spawn(worker);
        if spawned.is_err() {
            return false;
        }
        q.worker = true;
    }
    q.jobs.push_back(Job {
        device,
        next: ptr,
        end: ptr + size,
    });
    CHANGED.notify_all();
    true
}

/// Cancel every migration over `[start, end)` and wait for the piece in flight there, if any.
pub fn quiesce(start: usize, end: usize) {
    let mut q = lock(&QUEUE);
    if q.jobs.is_empty() && q.busy.is_none() {
        return;
    }
    q.jobs.retain(|j| !overlaps((j.next, j.end), (start, end)));
    while q.busy.is_some_and(|b| overlaps(b, (start, end))) {
        q = CHANGED.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

/// Bytes the worker has migrated so far.
pub fn migrated() -> u64 {
    lock(&QUEUE).migrated
}

/// Wait until every queued migration is done (tests, benchmarks).
pub fn wait_idle() {
    let mut q = lock(&QUEUE);
    while !q.jobs.is_empty() || q.busy.is_some() {
        q = CHANGED.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

fn worker() {
    loop {
        let (device, a, b, stream) = {
            let mut q = lock(&QUEUE);
            while q.jobs.is_empty() {
                q = CHANGED.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            let job = q.jobs.front_mut().expect("not empty");
            let (device, a) = (job.device, job.next);
            let b = (a + PIECE).min(job.end);
            job.next = b;
            if b == job.end {
                q.jobs.pop_front();
            }
            q.busy = Some((a, b));
            let stream = q.streams.iter().find(|s| s.0 == device).map(|s| s.1);
            (device, a, b, stream)
        };
        // Driver calls happen with no lock held.
        let stream = stream.or_else(|| {
            let s = cuda::stream_create(device).ok()?;
            lock(&QUEUE).streams.push((device, s));
            Some(s)
        });
        let moved = stream.is_some_and(|s| {
            cuda::prefetch(a, b - a, -1, s, device).is_ok()
                && cuda::stream_synchronize(s, device).is_ok()
        });
        let mut q = lock(&QUEUE);
        q.busy = None;
        if moved {
            q.migrated += (b - a) as u64;
        }
        CHANGED.notify_all();
    }
}

/// Fork: the queue's lock (last in the order: nothing is taken while it is held).
pub(crate) fn fork_lock(held: &mut crate::prim::fork::Held) {
    held.push(lock(&QUEUE));
}

/// In a `fork()` child: no worker, no jobs, no streams (the parent's are not valid here).
pub(crate) fn after_fork_child() {
    let mut q = lock(&QUEUE);
    q.jobs.clear();
    q.busy = None;
    q.streams.clear();
    q.worker = false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quiesce_cancels_queued_jobs_and_waits_for_the_piece_in_flight() {
        let base = 0x7a00_0000_0000usize;
        // Without a CUDA driver the worker's prefetches fail fast; the queue logic is the same.
        assert!(start(0, base, 40 * PIECE));
        assert!(start(0, base + 100 * PIECE, 2 * PIECE));
        quiesce(base, base + PIECE);
        {
            let q = lock(&QUEUE);
            assert!(
                q.jobs
                    .iter()
                    .all(|j| !overlaps((j.next, j.end), (base, base + PIECE)))
            );
            assert!(!q.busy.is_some_and(|b| overlaps(b, (base, base + PIECE))));
        }
        wait_idle();
        let q = lock(&QUEUE);
        assert!(q.jobs.is_empty() && q.busy.is_none());
    }
}
