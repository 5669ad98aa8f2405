//! Stream-ordered reuse for the memory GPU libraries allocate (CuPy, PyTorch).
//!
//! A freed block must never reach a new user while GPU work queued before the free can still
//! touch it. The rule, the one PyTorch's caching allocator and CuPy's pool follow, extended
//! with events the way cudaMallocAsync's pools are:
//!
//! - Each device has one [`Pool`] per stream. A block is allocated from the pool of the stream
//!   it will be used on, and a free returns it to that pool. Work on one stream runs in order,
//!   so a block freed on stream S is reused on S at once, with no event and no wait.
//! - Memory moves between streams only as whole chunks. When the last block of a chunk is
//!   freed, the pool records an event on its stream. A pool of another stream T that has
//!   nothing free that fits adopts such an idle chunk, and T waits for the event on the device
//!   (`cuStreamWaitEvent`: the host never blocks) unless the event has already completed.
//! - A free that names a stream other than the block's (a block used last on another stream)
//!   makes the block's stream wait for an event recorded on the named stream before the block
//!   goes back.
//! - Where an event cannot be recorded (a stream handle destroyed before its blocks were
//!   freed), the device is synchronised instead: slower, never unsafe.
//!
//! PyTorch passes the allocation stream to `free`. CuPy's free passes none; `ump_alloc`'s CuPy
//! allocator passes the current stream as CFunctionAllocator's `param`, so CuPy's blocks are
//! stream-ordered the same way (see `ffi::cupy`).

use crate::backing::{Backing, Chunk};
use crate::error::Result;
use crate::pool::{Group, Pool};
use crate::prim::cuda;
use crate::stats::PoolStats;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `CU_STREAM_LEGACY`: the legacy default stream by its explicit handle (same as 0).
const CU_STREAM_LEGACY: usize = 1;

/// The same stream by one name: the legacy default stream is 0 whichever handle names it.
#[inline]
pub fn normalize(stream: usize) -> usize {
    if stream == CU_STREAM_LEGACY {
        0
    } else {
        stream
    }
}

/// The pools of one device, one per stream, sharing counters and a limit.
pub struct StreamPools {
    device: i32,
    make_backing: Box<dyn Fn() -> Box<dyn Backing> + Send + Sync>,
    align: usize,
    limit: Option<usize>,
    retain: usize,
    /// Whether events order reuse across streams (false without a CUDA driver, in tests).
    ordered: bool,
    pub stats: &'static PoolStats,
    /// Pools of live streams (looked up by stream).
    pools: RwLock<Vec<&'static Pool>>,
    /// Pools of retired streams: their blocks are still freed into them, and their idle
    /// chunks serve other streams behind the retire event.
    retired: RwLock<Vec<&'static Pool>>,
    /// Cross-stream reuses ordered by a device-side wait on an event.
    pub waits: AtomicU64,
    /// Cross-stream reuses that had to synchronise (the event was not usable).
    pub syncs: AtomicU64,
}

impl StreamPools {
    /// Make the stream pools of `device`. They live for the whole process.
    pub fn new(
        device: i32,
        make_backing: Box<dyn Fn() -> Box<dyn Backing> + Send + Sync>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        ordered: bool,
        stats: &'static PoolStats,
    ) -> &'static StreamPools {
        Box::leak(Box::new(StreamPools {
            device,
            make_backing,
            align,
            limit,
            retain,
            ordered,
            stats,
            pools: RwLock::new(Vec::new()),
            retired: RwLock::new(Vec::new()),
            waits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        }))
    }

    pub fn device(&self) -> i32 {
        self.device
    }

    /// Every stream pool made so far, retired ones last.
    pub fn pools(&self) -> Vec<&'static Pool> {
        let mut v = self.pools.read().unwrap_or_else(|e| e.into_inner()).clone();
        v.extend(
            self.retired
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter(),
        );
        v
    }

    /// The stream `stream` is about to be destroyed: record the event that covers its work
    /// and never use the handle again (a new stream that gets the same handle gets a new
    /// pool). Returns whether this device had a pool for it. The legacy default stream is
    /// never retired.
    pub fn retire(&self, stream: usize) -> bool {
        let stream = normalize(stream);
        if stream == 0 {
            return false;
        }
        let p = {
            let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
            let Some(i) = pools.iter().position(|p| p.stream() == stream) else {
                return false;
            };
            pools.swap_remove(i)
        };
        if self.ordered {
            p.retire();
        }
        self.retired
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(p);
        true
    }

    /// The retired pool of handle `stream`, if the handle was retired and not reused since.
    fn retired_pool(&self, stream: usize) -> Option<&'static Pool> {
        let live = self.pools.read().unwrap_or_else(|e| e.into_inner());
        if live.iter().any(|p| p.stream() == stream) {
            return None; // the handle was reused by a live stream
        }
        drop(live);
        self.retired
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .rev()
            .find(|p| p.stream() == stream)
            .copied()
    }

    /// The pool of `stream` (0: the legacy default stream), made on first use.
    #[inline]
    pub fn pool_for(&'static self, stream: usize) -> Result<&'static Pool> {
        let stream = normalize(stream);
        {
            let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = pools.iter().find(|p| p.stream() == stream) {
                return Ok(p);
            }
        }
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.iter().find(|p| p.stream() == stream) {
            return Ok(p);
        }
        let p = Pool::for_stream(
            (self.make_backing)(),
            self.align,
            self.limit,
            self.retain,
            self,
            self.stats,
            stream,
        );
        pools.push(p);
        Ok(p)
    }

    /// Make `stream` wait for `ev`: on the device when the event is still pending, on the
    /// host (or the whole device) when the driver refuses that.
    fn order_after(&self, ev: &cuda::Event, stream: usize) {
        if matches!(ev.done(), Ok(true)) {
            return;
        }
        if ev.wait_on(stream).is_ok() {
            self.waits.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if ev.wait().is_err() {
            let _ = cuda::device_synchronize(self.device);
        }
    }

    /// A block of `pool` was last used on `stream`: before it goes back to `pool`, order
    /// `pool`'s stream after the work queued on `stream` so far.
    pub fn fence_free(&self, pool: &Pool, stream: usize) {
        let stream = normalize(stream);
        if !self.ordered || stream == pool.stream() {
            return;
        }
        if let Some(r) = self.retired_pool(stream) {
            // The handle is gone: its retire event stands for all its work.
            if let Some(ev) = r
                .retire_event
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
            {
                self.order_after(ev, pool.stream());
            }
            return;
        }
        match cuda::Event::record(stream, self.device) {
            Ok(ev) => self.order_after(&ev, pool.stream()),
            Err(_) => {
                self.syncs.fetch_add(1, Ordering::Relaxed);
                let _ = cuda::device_synchronize(self.device);
            }
        }
    }

    /// Return all cached memory of every stream (empty slabs included).
    pub fn trim(&self) -> usize {
        self.pools().iter().map(|p| p.trim()).sum()
    }

    /// Free bytes held by every stream's pool.
    pub fn cached_bytes(&self) -> usize {
        self.pools().iter().map(|p| p.cached_bytes()).sum()
    }
}

impl Group for StreamPools {
    fn ordered(&self) -> bool {
        self.ordered
    }

    fn count_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }

    /// Adopt for `taker` an idle chunk of at least `min` bytes from another stream's pool,
    /// ordered after the work that stream queued before the chunk fell idle.
    fn steal(&self, taker: &'static Pool, min: usize) -> Option<Chunk> {
        for p in self.pools() {
            if std::ptr::eq(p, taker) {
                continue;
            }
            if let Some((chunk, ev)) = p.take_idle_chunk(min) {
                if let Some(ev) = ev {
                    self.order_after(&ev, taker.stream());
                } else if p.is_retired()
                    && let Some(ev) = p
                        .retire_event
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                {
                    self.order_after(ev, taker.stream());
                }
                return Some(chunk);
            }
        }
        None
    }

    /// Under the limit, give back idle chunks of every stream so that `want` more bytes fit.
    fn make_room(&self, want: usize, need: usize) {
        let Some(limit) = self.limit else { return };
        let mapped = self.stats.mapped.load(Ordering::Relaxed);
        if mapped + want <= limit || mapped + need <= limit {
            return;
        }
        self.release_idle();
    }

    /// Give back every idle chunk of every stream. Returns the bytes given back.
    fn release_idle(&self) -> usize {
        self.pools().iter().map(|p| p.release_idle()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::{HostBacking, Kind};

    fn group(limit: Option<usize>) -> &'static StreamPools {
        let stats = Box::leak(Box::new(PoolStats::default()));
        StreamPools::new(
            0,
            Box::new(|| Box::new(HostBacking::for_device(Kind::UMP_KIND_SYSTEM, 0))),
            256,
            limit,
            usize::MAX,
            false,
            stats,
        )
    }

    #[test]
    fn streams_get_their_own_pools() {
        let g = group(None);
        let a = g.pool_for(0).unwrap();
        assert!(std::ptr::eq(a, g.pool_for(CU_STREAM_LEGACY).unwrap()));
        let b = g.pool_for(0x1000).unwrap();
        assert!(!std::ptr::eq(a, b));
        assert_eq!(b.stream(), 0x1000);
        assert_eq!(g.pools().len(), 2);
    }

    #[test]
    fn same_stream_reuses_at_once_and_other_streams_do_not_share_partial_chunks() {
        let g = group(None);
        let s1 = g.pool_for(0x10).unwrap();
        let s2 = g.pool_for(0x20).unwrap();
        let keep = s1.alloc(1 << 20).unwrap().ptr; // keeps s1's arena partly used
        let x = s1.alloc(4 << 20).unwrap().ptr;
        s1.free(x).unwrap();
        assert_eq!(
            s1.alloc(4 << 20).unwrap().ptr,
            x,
            "same stream: immediate reuse"
        );
        s1.free(x).unwrap();
        let mapped = g.stats.mapped.load(Ordering::Relaxed);
        let y = s2.alloc(4 << 20).unwrap().ptr;
        assert_ne!(y, x, "another stream must not reuse s1's block");
        assert_eq!(
            g.stats.mapped.load(Ordering::Relaxed),
            mapped + crate::pool::ARENA,
            "s1's chunk is still in use, so s2 maps its own"
        );
        s2.free(y).unwrap();
        s1.free(keep).unwrap();
    }

    #[test]
    fn idle_chunks_move_between_streams() {
        let g = group(None);
        let s1 = g.pool_for(0x30).unwrap();
        let s2 = g.pool_for(0x40).unwrap();
        let big = 48 << 20; // a dedicated chunk
        let x = s1.alloc(big).unwrap().ptr;
        s1.free(x).unwrap();
        let mapped = g.stats.mapped.load(Ordering::Relaxed);
        let y = s2.alloc(big).unwrap().ptr;
        assert_eq!(y, x, "the idle chunk of s1 serves s2");
        assert_eq!(
            g.stats.mapped.load(Ordering::Relaxed),
            mapped,
            "nothing new mapped"
        );
        assert!(crate::pool::lookup(y).is_some_and(|i| std::ptr::eq(i.pool, s2)));
        s2.free(y).unwrap();
        assert_eq!(g.trim(), big);
    }

    #[test]
    fn retired_streams_keep_their_blocks_and_lend_idle_chunks() {
        let g = group(None);
        let s1 = g.pool_for(0x70).unwrap();
        let x = s1.alloc(40 << 20).unwrap().ptr;
        let small = s1.alloc(100).unwrap().ptr;
        assert!(g.retire(0x70));
        assert!(!g.retire(0x70), "already retired");
        assert!(!g.retire(0), "the legacy stream is never retired");
        // The same handle, reused by a new stream, gets a new pool.
        let s1b = g.pool_for(0x70).unwrap();
        assert!(!std::ptr::eq(s1, s1b));
        // Blocks of the retired pool are still freed into it; its idle chunk serves others.
        s1.free(x).unwrap();
        s1.free(small).unwrap();
        let y = g.pool_for(0x80).unwrap().alloc(40 << 20).unwrap().ptr;
        assert_eq!(y, x);
        assert_eq!(g.pools().len(), 3);
        g.pool_for(0x80).unwrap().free(y).unwrap();
    }

    #[test]
    fn the_limit_covers_all_streams_and_idle_chunks_make_room() {
        let limit = 100 << 20;
        let g = group(Some(limit));
        let s1 = g.pool_for(0x50).unwrap();
        let s2 = g.pool_for(0x60).unwrap();
        let a = s1.alloc(40 << 20).unwrap().ptr;
        let b = s1.alloc(40 << 20).unwrap().ptr;
        assert!(
            s2.alloc(40 << 20).is_err(),
            "80 MiB mapped + 40 MiB > 100 MiB"
        );
        s1.free(a).unwrap();
        // s1's idle 40 MiB chunk moves to s2.
        let c = s2.alloc(40 << 20).unwrap().ptr;
        assert_eq!(c, a);
        s1.free(b).unwrap();
        s2.free(c).unwrap();
        // 80 MiB idle in two streams; 90 MiB needs both given back first.
        let d = s2.alloc(90 << 20).unwrap().ptr;
        assert!(g.stats.mapped.load(Ordering::Relaxed) <= limit);
        s2.free(d).unwrap();
    }
}
