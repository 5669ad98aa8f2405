//! Making a pool, and what it is: its constructors (host side, shared counters, a stream of a
//! device), its kind, device and size classes, the stream it serves and how reuse on it is
//! ordered, and whether it is the host side's primary pool.

use super::class::ClassTable;
use super::parts::{Commit, Decay, ForkHold, Retention};
use super::stats::PoolStats;
use super::types::{ClassState, Group, Large, Pool};
use crate::backing::{Backing, Kind};
use crate::prim::fork::lock;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("kind", &self.kind())
            .field("device", &self.device())
            .field("stream", &self.stream())
            .finish()
    }
}

impl Pool {
    /// Make a host-side pool (NumPy, the C malloc family). Pools live for the whole process
    /// (descriptors point back at them).
    pub fn new(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
    ) -> &'static Pool {
        let stats = Box::leak(Box::new(PoolStats::default()));
        Self::new_shared(backing, align, limit, retain, stats)
    }

    /// Make a host-side pool that shares counters `stats` with another (the host side's
    /// primary and fallback pools).
    pub fn new_shared(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        stats: &'static PoolStats,
    ) -> &'static Pool {
        Self::build(backing, align, limit, retain, stats, None, 0)
    }

    /// Make the pool of `stream` inside a device's stream pools, sharing their counters.
    /// Its limit is the group's ([`Group::limit`]).
    pub fn for_stream(
        backing: Box<dyn Backing>,
        align: usize,
        retain: usize,
        group: &'static dyn Group,
        stats: &'static PoolStats,
        stream: usize,
    ) -> &'static Pool {
        Self::build(backing, align, None, retain, stats, Some(group), stream)
    }

    fn build(
        backing: Box<dyn Backing>,
        align: usize,
        limit: Option<usize>,
        retain: usize,
        stats: &'static PoolStats,
        group: Option<&'static dyn Group>,
        stream: usize,
    ) -> &'static Pool {
        // Host-side pools give small blocks their natural alignment; device pools do not.
        let table = ClassTable::new(align, group.is_none());
        let classes = (0..table.len())
            .map(|_| Mutex::new(ClassState::default()))
            .collect();
        let hot = (0..table.len()).map(|_| AtomicUsize::new(0)).collect();
        let commit = Commit::new(backing.commit_page());
        let hold = ForkHold::new(backing.fork_shared());
        Box::leak(Box::new(Pool {
            kind: backing.kind(),
            device: backing.device(),
            backing,
            table,
            classes,
            large: Mutex::new(Large::default()),
            stats,
            key: AtomicUsize::new(stream << 1),
            group,
            retire_event: Mutex::new(None),
            limit,
            retention: Retention::new(retain),
            hot,
            idle: Decay::default(),
            commit,
            hold,
            peer: std::sync::OnceLock::new(),
            host_primary: AtomicBool::new(false),
        }))
    }
    /// Whether this pool's stream was retired.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.key.load(Ordering::Acquire) & 1 != 0
    }

    /// Whether this pool serves `stream` and is not retired (lock-free).
    #[inline]
    pub(crate) fn serves(&self, stream: usize) -> bool {
        self.key.load(Ordering::Acquire) == stream << 1
    }

    /// Whether this pool is the retired pool of `stream`.
    pub(crate) fn retired_for(&self, stream: usize) -> bool {
        self.key.load(Ordering::Acquire) == stream << 1 | 1
    }

    /// The stream this pool serves (0 unless stream-ordered).
    #[inline]
    pub fn stream(&self) -> usize {
        self.key.load(Ordering::Acquire) >> 1
    }

    /// Whether this pool is one of a device's stream-ordered pools.
    pub fn is_stream_ordered(&self) -> bool {
        self.group.is_some()
    }
    /// Whether freed memory must be fenced with events before another stream uses it.
    pub(super) fn ordered(&self) -> bool {
        self.group.is_some_and(|g| g.ordered())
    }

    /// Wait on the host for the work queued on this pool's stream (a retired stream: for its
    /// retire event), before the host writes memory the pool handed out: a stream-ordered pool
    /// hands out memory freed in its stream's order, which kernels queued before the free may
    /// still use. Nothing for pools whose reuse is not ordered by events.
    pub(crate) fn host_wait(&'static self) {
        if !self.ordered() {
            return;
        }
        if self.is_retired() {
            let fence = lock(&self.retire_event).clone();
            if let Some(fence) = fence {
                fence.wait();
            }
        } else if let Some(g) = self.group {
            g.host_wait(self.stream());
        }
    }

    #[inline]
    pub fn kind(&self) -> Kind {
        self.kind
    }

    #[inline]
    pub fn device(&self) -> i32 {
        self.device
    }

    pub fn alignment(&self) -> usize {
        self.table.align
    }

    /// The size classes of this pool.
    pub fn classes(&self) -> &ClassTable {
        &self.table
    }

    pub fn backing(&self) -> &dyn Backing {
        &*self.backing
    }
    /// This pool is the host side's primary pool: the malloc family's small allocations may
    /// come from its thread caches without going through the host side's choice of pool.
    /// Before the first allocation.
    pub fn mark_host_primary(&self) {
        self.host_primary.store(true, Ordering::Relaxed);
    }

    /// Whether this is the host side's primary pool.
    pub(crate) fn is_host_primary(&self) -> bool {
        self.host_primary.load(Ordering::Relaxed)
    }
}
