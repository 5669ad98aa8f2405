//! The registry: which address belongs to which block descriptor, answered lock-free.
//!
//! A two-level radix table over the 48-bit user address space, one entry per 64 KiB granule
//! (mimalloc's segment map, at a finer grain). An entry is a tagged pointer to a span or slab
//! descriptor; descriptors are never freed, only recycled, so a reader that loads an entry can
//! always dereference it and then checks the range it describes. Readers do two atomic loads;
//! writers (chunk and span changes, all rare next to allocations) store entries one by one.

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// Registry granule: every chunk and every span starts and ends on a multiple of it.
pub(crate) const GRANULE_SHIFT: u32 = 16;
pub(crate) const GRANULE: usize = 1 << GRANULE_SHIFT;

const ADDR_BITS: u32 = 48;
const LEAF_BITS: u32 = 16;
const TOP_BITS: u32 = ADDR_BITS - GRANULE_SHIFT - LEAF_BITS;
const LEAF_LEN: usize = 1 << LEAF_BITS;
const TOP_LEN: usize = 1 << TOP_BITS;

type Leaf = [AtomicUsize; LEAF_LEN];

static TOP: [AtomicPtr<Leaf>; TOP_LEN] = [const { AtomicPtr::new(ptr::null_mut()) }; TOP_LEN];

/// Highest address (exclusive) the registry covers.
pub(crate) const ADDR_LIMIT: usize = 1 << ADDR_BITS;

fn split(addr: usize) -> (usize, usize) {
    let g = addr >> GRANULE_SHIFT;
    (g >> LEAF_BITS, g & (LEAF_LEN - 1))
}

fn leaf(top: usize, create: bool) -> Option<&'static Leaf> {
    let p = TOP[top].load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: leaves are never freed once published.
        return Some(unsafe { &*p });
    }
    if !create {
        return None;
    }
    let bytes = std::mem::size_of::<Leaf>();
    let fresh = crate::prim::os::map_aligned(bytes, crate::prim::os::page_size())?;
    let fresh = fresh.as_ptr().cast::<Leaf>();
    match TOP[top].compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: we just published it; zeroed memory is a valid array of AtomicUsize.
        Ok(_) => Some(unsafe { &*fresh }),
        Err(existing) => {
            // SAFETY: our leaf was never published; `existing` is a published leaf.
            unsafe { crate::prim::os::unmap(NonNull::new_unchecked(fresh.cast()), bytes) };
            Some(unsafe { &*existing })
        }
    }
}

/// The entry covering `addr`, or 0.
#[inline]
pub fn get(addr: usize) -> usize {
    if addr >= ADDR_LIMIT {
        return 0;
    }
    let (t, l) = split(addr);
    let p = TOP[t].load(Ordering::Acquire);
    if p.is_null() {
        return 0;
    }
    // SAFETY: published leaves live forever.
    unsafe { (*p)[l].load(Ordering::Acquire) }
}

/// Point every granule of `[start, start+len)` at `value` (0 clears).
/// `start` and `len` must be granule multiples. Returns false if the range is outside the
/// registry or a leaf could not be mapped (nothing is left half-set in that case).
pub fn set_range(start: usize, len: usize, value: usize) -> bool {
    debug_assert!(start % GRANULE == 0 && len % GRANULE == 0);
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    if end > ADDR_LIMIT {
        return false;
    }
    // Create every leaf first so that a failure leaves no partial range behind.
    let mut a = start;
    while a < end {
        let (t, _) = split(a);
        if value != 0 && leaf(t, true).is_none() {
            return false;
        }
        a = ((t + 1) << (LEAF_BITS + GRANULE_SHIFT)).min(end);
    }
    let mut a = start;
    while a < end {
        let (t, l) = split(a);
        if let Some(leaf) = leaf(t, false) {
            leaf[l].store(value, Ordering::Release);
        }
        a += GRANULE;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let base = 0x5a5a_0000_0000usize;
        assert_eq!(get(base), 0);
        assert!(set_range(base, 3 * GRANULE, 0xdead_bee8));
        assert_eq!(get(base), 0xdead_bee8);
        assert_eq!(get(base + 3 * GRANULE - 1), 0xdead_bee8);
        assert_eq!(get(base + 3 * GRANULE), 0);
        assert_eq!(get(base - 1), 0);
        assert!(set_range(base, 3 * GRANULE, 0));
        assert_eq!(get(base + GRANULE), 0);
    }

    #[test]
    fn out_of_range() {
        assert_eq!(get(usize::MAX), 0);
        assert!(!set_range(ADDR_LIMIT - GRANULE, 2 * GRANULE, 8));
        assert!(!set_range(usize::MAX - GRANULE + 1, GRANULE, 8));
    }

    #[test]
    fn crosses_a_leaf_boundary() {
        let leaf_span = 1usize << (LEAF_BITS + GRANULE_SHIFT);
        let base = 0x3b00_0000_0000usize + leaf_span - GRANULE;
        assert!(set_range(base, 2 * GRANULE, 16));
        assert_eq!(get(base), 16);
        assert_eq!(get(base + GRANULE), 16);
        assert!(set_range(base, 2 * GRANULE, 0));
    }
}
