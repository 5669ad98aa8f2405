//! The allocator's statistics in the C layout (`ump_stats`, one `ump_usage` per part): what
//! every pool counts (`pool::stats`), collected over the host side and each device's stream
//! pools, with the errors, scopes and pinned memory. RMM's statistics adaptor keeps the
//! counters; this is the report over all of them.

use crate::allocator;
use crate::backing::Kind;
use crate::error::ERRORS;
use crate::pool::stats::ump_usage;
use std::sync::atomic::{AtomicU64, Ordering};

/// Collect the counters of every pool.
pub fn collect_stats() -> ump_stats {
    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut s = ump_stats {
        size: 0,
        version: UMP_STATS_VERSION,
        mode: crate::mode::ump_mode::UMP_MODE_UNSET,
        device_count: 0,
        total: ump_usage::default(),
        host: ump_usage::default(),
        host_kind: Kind::UMP_KIND_UNKNOWN,
        device_kind: Kind::UMP_KIND_UNKNOWN,
        kinds: [ump_usage::default(); STATS_KINDS],
        devices: [ump_usage::default(); STATS_DEVICES],
        streams: 0,
        stream_waits: 0,
        stream_syncs: 0,
        scopes_open: crate::scope::open_count() as u64,
        errors: c(&ERRORS.total),
        errors_oom: c(&ERRORS.oom),
        errors_invalid_free: c(&ERRORS.invalid_free),
        errors_double_free: c(&ERRORS.double_free),
        errors_bad_size: c(&ERRORS.bad_size),
        errors_other: c(&ERRORS.other),
        host_fallback_allocs: 0,
        host_fallback_mapped: 0,
        pinned: 0,
        pinned_cap: 0,
        device_reserved: [0; STATS_DEVICES],
        device_discarded: [0; STATS_DEVICES],
        device_largest_free: [0; STATS_DEVICES],
        host_reserved: 0,
        host_largest_free: 0,
        host_reallocs_in_place: 0,
        host_reallocs_copied: 0,
        host_realloc_copied_bytes: 0,
        host_fork_held: 0,
        host_fork_held_blocks: 0,
    };
    let Some(a) = allocator::get() else {
        return s;
    };
    crate::pool::flush_thread_counts();
    // Without asking the machine (a NumPy-only process loads no CUDA for its statistics).
    s.mode = a
        .mode_known()
        .map_or(crate::mode::ump_mode::UMP_MODE_UNSET, |m| m.to_c());
    let host = a.host_pool();
    // What no child may read any more is not counted as held.
    host.release_held(true);
    s.host_fork_held = host.stats.fork_held.load(Ordering::Relaxed) as u64;
    s.host_fork_held_blocks = host.stats.fork_held_blocks.load(Ordering::Relaxed) as u64;
    s.host = host.stats.usage();
    s.host.cached = a.host().cached_bytes() as u64;
    let (fb_allocs, fb_mapped) = a.host().fallback_usage();
    s.host_fallback_allocs = fb_allocs;
    s.host_fallback_mapped = fb_mapped as u64;
    let (pinned, cap) = crate::backing::pinned();
    s.pinned = pinned as u64;
    s.pinned_cap = cap as u64;
    for p in a.host().pools() {
        let r = p.report();
        s.host_reserved += r.reserved as u64;
        s.host_largest_free = s.host_largest_free.max(r.largest_free as u64);
    }
    s.host_reallocs_in_place = c(&host.stats.reallocs_in_place);
    s.host_reallocs_copied = c(&host.stats.reallocs_copied);
    s.host_realloc_copied_bytes = c(&host.stats.realloc_copied_bytes);
    s.host_kind = host.kind();
    s.kinds[host.kind() as usize].add(&s.host);
    s.total.add(&s.host);
    // The device side's kind; PyTorch's segments may be plain device memory beside it (their
    // usage counts in `kinds` by their own kind, and in `devices` with the device side's).
    if let Some(g) = a.gpu_if_chosen() {
        s.device_kind = g.selection.sides.device.kind();
    }
    // A device's pool sets share one set of counters: counted once, with each set's cache.
    let mut counted: Vec<*const crate::pool::PoolStats> = Vec::new();
    for g in a.device_groups() {
        let pools = g.pools();
        let Some(first) = pools.first() else { continue };
        let stats: *const crate::pool::PoolStats = g.stats;
        let first_of_device = !counted.contains(&stats);
        let mut u = if first_of_device {
            counted.push(stats);
            g.stats.usage()
        } else {
            ump_usage::default()
        };
        u.cached = g.cached_bytes() as u64;
        s.kinds[first.kind() as usize].add(&u);
        s.total.add(&u);
        s.streams += pools.len() as u64;
        s.stream_waits += g.waits.load(Ordering::Relaxed);
        s.stream_syncs += g.syncs.load(Ordering::Relaxed);
        if let Ok(i) = usize::try_from(g.device())
            && i < STATS_DEVICES
        {
            s.devices[i].add(&u);
            s.device_count = s.device_count.max(i as u32 + 1);
            if first_of_device {
                s.device_discarded[i] += c(&g.stats.discarded);
            }
            for r in g.reports() {
                s.device_reserved[i] += r.reserved as u64;
                s.device_largest_free[i] = s.device_largest_free[i].max(r.largest_free as u64);
            }
        }
    }
    s
}

/// A snapshot of every pool: the host side's (device -1; the primary, then the fallback) and
/// each device's, one per stream.
pub fn pool_reports() -> Vec<(i32, crate::pool::PoolReport)> {
    let Some(a) = allocator::get() else {
        return Vec::new();
    };
    let host = a.host().pools().map(|p| (-1, p.report()));
    let devices = a
        .device_groups()
        .into_iter()
        .flat_map(|g| g.reports().into_iter().map(move |r| (g.device(), r)));
    host.chain(devices).collect()
}

/// Reset every peak to the current value.
pub fn reset_peaks() {
    let Some(a) = allocator::get() else {
        return;
    };
    a.host_pool().stats.reset_peak();
    for g in a.device_groups() {
        g.stats.reset_peak();
    }
    crate::pool::stats::reset_device_side_peaks();
}

/// Version of `ump_stats` (2: the `host_fallback_*` and `pinned*` fields; 3: address space
/// reserved and the largest free block, per device and for the host side, and the host side's
/// reallocs with and without a copy; 4: the host side's blocks held back for fork children).
pub const UMP_STATS_VERSION: u32 = 4;
/// Most devices `ump_stats` reports on (`UMP_MAX_DEVICES`; the struct spells out 16 so that
/// the header does too).
pub(crate) const STATS_DEVICES: usize = 16;
/// Entries of `ump_stats.kinds` (one per `ump_kind` value; spelled out as 8 likewise).
pub(crate) const STATS_KINDS: usize = 8;

/// Counters of the whole allocator. Versioned (mimalloc's pattern): set `size` to
/// `sizeof(ump_stats)` (0 means "the current size") before calling `ump_stats`.
///
/// Peaks of one pool side (`host`, each `devices[i]`) are exact. Where a total adds up
/// several sides (`total`, and a kind both the host side and devices use, as `managed` in
/// managed mode), its peak is the sum of their peaks: an upper bound of the true peak.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[allow(non_camel_case_types)]
pub struct ump_stats {
    /// In: bytes the caller provides (0: the current size). Out: bytes written.
    pub size: u32,
    /// Out: `UMP_STATS_VERSION`.
    pub version: u32,
    /// The mode in force (`UMP_MODE_UNSET` before the first allocation: all counts are 0).
    pub mode: crate::mode::ump_mode,
    /// Entries of `devices` that are filled (devices with a pool so far are non-zero).
    pub device_count: u32,
    /// Everything together.
    pub total: ump_usage,
    /// The host side: NumPy and the C malloc family.
    pub host: ump_usage,
    /// What kind of memory the host side hands out.
    pub host_kind: crate::backing::ump_kind,
    /// What kind of memory the device side (CuPy, PyTorch) hands out.
    pub device_kind: crate::backing::ump_kind,
    /// Per kind, indexed by `ump_kind` (host side and all devices together).
    pub kinds: [ump_usage; 8],
    /// Per device: all streams of that device together.
    pub devices: [ump_usage; 16],
    /// Stream pools made so far (one per device and stream in use).
    pub streams: u64,
    /// Idle chunks or blocks that moved to another stream behind a device-side event wait.
    pub stream_waits: u64,
    /// Moves between streams that had to synchronise instead (an unusable stream handle).
    pub stream_syncs: u64,
    /// Scopes open now (all threads).
    pub scopes_open: u64,
    /// Errors reported so far, in total and by class (see `ump_error_count`).
    pub errors: u64,
    pub errors_oom: u64,
    pub errors_invalid_free: u64,
    pub errors_double_free: u64,
    pub errors_bad_size: u64,
    pub errors_other: u64,
    /// NumPy allocations served by plain host memory because the host side's own memory was
    /// not available (the pinned cap reached, pinning failed, or a `fork()` child).
    pub host_fallback_allocs: u64,
    /// Bytes the host side's fallback pool holds now.
    pub host_fallback_mapped: u64,
    /// Bytes of host memory pinned now (both sides), and the cap (`UMP_ALLOC_PINNED_LIMIT`).
    pub pinned: u64,
    pub pinned_cap: u64,
    /// Per device: bytes of address space its pools hold. A virtual-memory pool reserves more
    /// than it maps (`devices[i].mapped` counts the physical memory mapped into it); for other
    /// pools the two are equal but for rounding.
    pub device_reserved: [u64; 16],
    /// Per device: the largest free block any of its pools serves without mapping more.
    /// With `devices[i].cached`, it measures fragmentation (1 - largest free / cached).
    pub device_largest_free: [u64; 16],
    /// Per device, managed memory: bytes discarded so far (freed blocks the host had read,
    /// and reused ones discarded-and-prefetched to the device; `UMP_ALLOC_MANAGED_DISCARD`).
    pub device_discarded: [u64; 16],
    /// The host side: bytes of address space its pools hold, and the largest free block.
    pub host_reserved: u64,
    pub host_largest_free: u64,
    /// The host side's `ump_realloc`s: done without a copy (the block stayed, grew over free
    /// memory or with its chunk, or moved with its pages), and those that copied, with the
    /// bytes they copied.
    pub host_reallocs_in_place: u64,
    pub host_reallocs_copied: u64,
    pub host_realloc_copied_bytes: u64,
    /// Pinned host side shared with `fork()` children (`UMP_ALLOC_PINNED_FORK=share`): bytes
    /// and blocks freed (or moved by `ump_realloc`) by this process but held back, not reused,
    /// while a child forked when they were live, or a fork child of that child, may still read
    /// them. They go back once no such child lives: each child holds a lock the kernel drops
    /// when it and its own fork children have exited or called `exec`; the locks are looked at
    /// on the allocation slow path at most every 10 ms, and at once by `ump_trim` and
    /// `ump_stats`. A descriptor is opened ahead for each fork's lock, so a fork made with no
    /// descriptor left is tracked too; only without `/proc/self/fd` (or with no descriptor to
    /// be had even past the soft limit) is a child untracked, and what it may read stays held
    /// for the life of the process (with a warning).
    pub host_fork_held: u64,
    pub host_fork_held_blocks: u64,
}

const _: () = assert!(STATS_KINDS == Kind::UMP_KIND_FOREIGN_HOST as usize + 1);
