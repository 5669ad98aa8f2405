//! The host side (NumPy and the C malloc family): the pool of its kind of memory, and, where
//! that memory is limited or not fork-safe, a pool of plain host memory to fall back on.
//!
//! - **Pinned** host memory cannot be swapped, so it is capped (`UMP_ALLOC_PINNED_LIMIT`).
//!   When the cap is reached or pinning fails, NumPy still gets memory: plain host memory from
//!   the fallback pool, counted in `ump_stats` (`host_fallback_*`), with one warning on stderr.
//!   Arrays there are ordinary host memory: GPU libraries copy them.
//! - In a **fork()** child no CUDA call may happen: the pinned pool still serves what it holds
//!   (the child's copies of the parent's pages are plain memory there), and new memory comes
//!   from the fallback. A managed host side (forced) is not fork-safe at all: its memory
//!   faults in the child, so every allocation there goes to the fallback, and arrays made
//!   before the fork must not be touched in the child.
//!
//! Both pools share one set of counters: `ump_stats().host` is the whole host side, and
//! `UMP_ALLOC_LIMIT` bounds both together.

use crate::backing::{Backing, HostBacking, Kind, ManagedBacking, RegisteredBacking};
use crate::config::{Config, PinnedFork};
use crate::error::{ErrorClass, Result, Status};
use crate::mode::HostSide;
use crate::pool::PoolStats;
use crate::pool::{Alloc, Pool};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How long idle pinned chunks above `retain` are kept before they are unpinned (pinning a
/// GiB costs about half a second; a loop of large arrays reuses them meanwhile).
pub const PINNED_DECAY: Duration = Duration::from_secs(5);

/// The host side's pools.
pub struct HostPools {
    side: HostSide,
    /// Pinned side: whether its pages are shared with fork() children (`backing::shared`), or
    /// why they are copied.
    fork_share: std::result::Result<(), String>,
    primary: &'static Pool,
    fallback: Option<&'static Pool>,
    /// Allocations the fallback served.
    fallback_allocs: AtomicU64,
    warned: AtomicBool,
    /// The host side's memory is pinned at the process's first use of a GPU
    /// (`UMP_ALLOC_PIN=lazy` or `lazy-all`).
    lazy_pin: bool,
    /// The fallback (plain host memory) serves large blocks until then (see `new`).
    plain_until_pinned: bool,
}

impl HostPools {
    /// Make the host side `side` for `config`.
    pub fn new(side: HostSide, config: &Config) -> HostPools {
        let (backing, retain): (Box<dyn Backing>, usize) = match side {
            HostSide::Host => (
                Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
                config.host_retain,
            ),
            HostSide::System => (
                Box::new(HostBacking::new(Kind::UMP_KIND_SYSTEM)),
                config.host_retain,
            ),
            HostSide::Pinned => {
                use crate::config::Pin;
                let share = config.pinned_fork == PinnedFork::Share;
                let lazy = config.pin != Pin::Eager;
                let (b, why) = RegisteredBacking::host(share, lazy);
                let mut h = Self::with_backing(side, Box::new(b), config.host_retain, config);
                h.fork_share = why;
                // Until the process uses a GPU, NumPy's memory need not be pinned, nor shared
                // with fork children (plain pages are copied on write as NumPy's own are). Where
                // the kernel gives shared memory 4 KiB pages only, shared pages cost about 4x
                // NumPy's huge pages to fault in (a 512 MiB array: +0.36 s on the lent H100):
                // plain host memory serves the large blocks until then (small ones stay in the
                // pinned side's arenas, pinned later with the thread caches they feed).
                // Elsewhere, shared pages for all, pinned later.
                h.lazy_pin = lazy;
                h.plain_until_pinned = config.pin == Pin::Lazy
                    && h.fork_share.is_ok()
                    && !crate::prim::os::shmem_huge_pages();
                return h;
            }
            HostSide::Managed => (Box::new(ManagedBacking::new(-1, 0, true)), usize::MAX),
        };
        Self::with_backing(side, backing, retain, config)
    }

    /// Make the host side `side` over `backing` (tests inject backings here).
    pub fn with_backing(
        side: HostSide,
        backing: Box<dyn Backing>,
        retain: usize,
        config: &Config,
    ) -> HostPools {
        let stats: &'static PoolStats = Box::leak(Box::new(PoolStats::default()));
        let primary = Pool::new_shared(backing, config.alignment, config.limit, retain, stats);
        if side != HostSide::Managed {
            // The malloc family's fast path serves small blocks from this pool's thread
            // caches. Not for a managed host side: its fork() children must get the fallback.
            primary.mark_host_primary();
        }
        if side == HostSide::Pinned {
            primary.set_decay(PINNED_DECAY);
        }
        let fallback = matches!(side, HostSide::Pinned | HostSide::Managed).then(|| {
            let fb = Pool::new_shared(
                Box::new(HostBacking::new(Kind::UMP_KIND_HOST)),
                config.alignment,
                config.limit,
                config.host_retain,
                stats,
            );
            primary.share_limit_with(fb);
            fb
        });
        let fork_share = if primary.backing().fork_shared() {
            Ok(())
        } else {
            Err(format!(
                "the {} host side's pages are not shared",
                side.name()
            ))
        };
        HostPools {
            side,
            fork_share,
            primary,
            fallback,
            fallback_allocs: AtomicU64::new(0),
            warned: AtomicBool::new(false),
            lazy_pin: false,
            plain_until_pinned: false,
        }
    }

    /// The kind of memory the host side is made of.
    pub fn side(&self) -> HostSide {
        self.side
    }

    /// The pool of the host side's own kind of memory.
    pub fn primary(&self) -> &'static Pool {
        self.primary
    }

    /// The pools of the host side, primary first.
    pub fn pools(&self) -> impl Iterator<Item = &'static Pool> {
        std::iter::once(self.primary).chain(self.fallback)
    }

    /// Allocate `n` bytes: from the primary pool, else (cap reached, pinning failed, a fork()
    /// child) from the fallback.
    #[inline]
    pub fn alloc(&self, n: usize) -> Result<Alloc> {
        let Some(fb) = self.fallback else {
            return self.primary.alloc(n);
        };
        if self.side == HostSide::Managed && crate::prim::fork::is_fork_child() {
            return self.fall_back(fb, n);
        }
        if self.lazy_pin && n > crate::pool::SMALL_MAX && !crate::backing::host_pinning_active() {
            // A context someone made since (PyTorch, CuPy): the process uses a GPU now. Asked
            // here, before any lock of a pool (the question may take the dynamic loader's
            // lock), for large blocks only (a few microseconds each).
            match crate::prim::cuda::active_context_device() {
                Some(dev) => crate::backing::pin_host_side(Some(dev)),
                None if self.plain_until_pinned => return self.fall_back(fb, n),
                None => {}
            }
        }
        match self.primary.alloc(n) {
            Ok(a) => Ok(a),
            Err(e)
                if e.class != ErrorClass::Limit
                    && matches!(e.status, Status::UMP_ERR_OOM | Status::UMP_ERR_UNSUPPORTED) =>
            {
                self.warn_once(&e.msg);
                self.fall_back(fb, n)
            }
            Err(e) => Err(e),
        }
    }

    #[cold]
    fn fall_back(&self, fb: &'static Pool, n: usize) -> Result<Alloc> {
        let a = fb.alloc(n)?;
        self.fallback_allocs.fetch_add(1, Ordering::Relaxed);
        Ok(a)
    }

    #[cold]
    fn warn_once(&self, why: &str) {
        if crate::prim::fork::is_fork_child() || self.warned.swap(true, Ordering::Relaxed) {
            return;
        }
        eprintln!(
            "ump-alloc: warning: {} host memory is not available for NumPy ({why}); new arrays \
             use plain host memory, which GPU libraries copy instead of reading in place. \
             Counted in ump_alloc.stats()['host_fallback']; see UMP_ALLOC_PINNED_LIMIT.",
            self.side.name()
        );
    }

    /// What `fork()` does with this host side's memory (see [`fork_rule`]).
    pub fn fork_rule(&self) -> (bool, String) {
        fork_rule(self.side, &self.fork_share)
    }

    /// Allocations the fallback served, and the bytes its pool holds now.
    pub fn fallback_usage(&self) -> (u64, usize) {
        (
            self.fallback_allocs.load(Ordering::Relaxed),
            self.fallback.map_or(0, |p| p.mapped_bytes()),
        )
    }

    /// Give back every cached byte of the host side. Returns the bytes given back.
    pub fn trim(&self) -> usize {
        self.pools().map(|p| p.trim()).sum()
    }

    /// Free bytes the host side holds.
    pub fn cached_bytes(&self) -> usize {
        self.pools().map(|p| p.cached_bytes()).sum()
    }
}

/// What `fork()` does with host side `side`'s memory: whether its pages are shared with the
/// children (pinned pages of one shared file: `share` is Ok) rather than copied, and the rule
/// in one line (for `info`).
pub fn fork_rule(side: HostSide, share: &std::result::Result<(), String>) -> (bool, String) {
    let rule = match (side, share) {
        (HostSide::Pinned, Ok(())) => "share: fork() copies no pinned page; children map them \
             copy-on-write (their writes stay theirs) but see the parent's later writes to \
             arrays made before the fork on pages they did not write; freed ones are held back \
             while a child lives"
            .to_string(),
        (HostSide::Pinned, Err(why)) => format!(
            "copy: fork() copies every pinned page into the child at once (exact copies; \
             about 1 s per GiB on the lent H100): {why}"
        ),
        (HostSide::Managed, _) => "not fork-safe: children must not touch arrays made before \
             the fork (managed memory)"
            .to_string(),
        (HostSide::Host | HostSide::System, _) => "copy-on-write: children get the arrays as \
             they were at the fork (plain memory)"
            .to_string(),
    };
    (side == HostSide::Pinned && share.is_ok(), rule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::Chunk;
    use crate::error::Error;
    use std::sync::atomic::AtomicUsize;

    /// Host memory that refuses (as the pinned cap does) past `cap` bytes.
    struct Capped {
        inner: HostBacking,
        used: AtomicUsize,
        cap: usize,
    }

    impl Backing for Capped {
        fn kind(&self) -> Kind {
            Kind::UMP_KIND_REGISTERED
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            if self.used.load(Ordering::Relaxed) + size > self.cap {
                return Err(Error::unsupported("cap reached"));
            }
            self.used.fetch_add(size, Ordering::Relaxed);
            self.inner.map(size)
        }
        unsafe fn unmap(&self, chunk: &Chunk) {
            self.used.fetch_sub(chunk.size, Ordering::Relaxed);
            // SAFETY: forwarded.
            unsafe { self.inner.unmap(chunk) }
        }
    }

    /// Pinned host memory that refuses (as the cap does) while `refuse` is set.
    struct Toggle {
        inner: HostBacking,
        refuse: &'static std::sync::atomic::AtomicBool,
    }

    impl Backing for Toggle {
        fn kind(&self) -> Kind {
            Kind::UMP_KIND_REGISTERED
        }
        fn device(&self) -> i32 {
            -1
        }
        fn map(&self, size: usize) -> Result<Chunk> {
            if self.refuse.load(Ordering::Relaxed) {
                return Err(Error::unsupported("cap reached"));
            }
            self.inner.map(size)
        }
        unsafe fn unmap(&self, chunk: &Chunk) {
            // SAFETY: forwarded.
            unsafe { self.inner.unmap(chunk) }
        }
    }

    /// Found by the two-pool model (issue 21): the primary and the fallback share the limit,
    /// but an allocation the limit refused in one gave back only that pool's cache, so memory
    /// the other cached made the allocation fail.
    #[test]
    fn the_limit_retry_gives_back_what_the_other_pool_caches() {
        let config = Config {
            host_retain: usize::MAX,
            limit: Some(96 << 20),
            ..Config::default()
        };
        let refuse: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(true)));
        let h = HostPools::with_backing(
            HostSide::Pinned,
            Box::new(Toggle {
                inner: HostBacking::new(Kind::UMP_KIND_HOST),
                refuse,
            }),
            usize::MAX,
            &config,
        );
        // Pinning refused: the fallback serves, and keeps the chunk cached once it is freed.
        let a = h.alloc(40 << 20).unwrap().ptr;
        assert_eq!(
            crate::pool::lookup(a).unwrap().pool.kind(),
            Kind::UMP_KIND_HOST
        );
        crate::pool::free_block(a).unwrap();
        assert_eq!(h.fallback_usage().1, 40 << 20, "the fallback keeps it");
        // Pinning works again: 80 MiB passes the limit beside the fallback's cache.
        refuse.store(false, Ordering::Relaxed);
        let b = h
            .alloc(80 << 20)
            .expect("the fallback's cache goes back before the limit refuses");
        assert_eq!(
            crate::pool::lookup(b.ptr).unwrap().pool.kind(),
            Kind::UMP_KIND_REGISTERED
        );
        assert_eq!(h.fallback_usage().1, 0);
        crate::pool::free_block(b.ptr).unwrap();
        h.trim();
    }

    #[test]
    fn past_the_cap_numpy_gets_plain_memory_and_it_is_counted() {
        let config = Config {
            host_retain: 0,
            ..Config::default()
        };
        let cap = 80 << 20;
        let h = HostPools::with_backing(
            HostSide::Pinned,
            Box::new(Capped {
                inner: HostBacking::new(Kind::UMP_KIND_HOST),
                used: AtomicUsize::new(0),
                cap,
            }),
            0,
            &config,
        );
        let mut blocks = Vec::new();
        for _ in 0..6 {
            blocks.push(h.alloc(40 << 20).unwrap().ptr);
        }
        let kinds: Vec<Kind> = blocks
            .iter()
            .map(|&p| crate::pool::lookup(p).unwrap().pool.kind())
            .collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|&&k| k == Kind::UMP_KIND_REGISTERED)
                .count(),
            2,
            "two 40 MiB chunks fit the 80 MiB cap"
        );
        assert_eq!(
            kinds.iter().filter(|&&k| k == Kind::UMP_KIND_HOST).count(),
            4
        );
        let (allocs, mapped) = h.fallback_usage();
        assert_eq!((allocs, mapped), (4, 4 * (40 << 20)));
        assert_eq!(
            h.primary().stats.in_use(),
            6 * (40 << 20),
            "one set of counters"
        );
        // Small blocks too, once the cap leaves no room for a slab's arena.
        let s = h.alloc(1000).unwrap().ptr;
        assert_eq!(
            crate::pool::lookup(s).unwrap().pool.kind(),
            Kind::UMP_KIND_HOST
        );
        crate::pool::free_block(s).unwrap();
        for p in blocks {
            crate::pool::free_block(p).unwrap();
        }
        assert_eq!(h.primary().stats.in_use(), 0);
        // With the cap freed again, the pinned pool serves once more.
        let p = h.alloc(40 << 20).unwrap().ptr;
        assert_eq!(
            crate::pool::lookup(p).unwrap().pool.kind(),
            Kind::UMP_KIND_REGISTERED
        );
        crate::pool::free_block(p).unwrap();
    }
}
