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

/// Make sure every leaf covering `[start, start+len)` exists, so that [`set_range`] on any part
/// of the range cannot fail. This is the one fallible step of the registry: it maps memory for
/// missing leaves. Returns false when the range is outside the registry or a leaf could not be
/// mapped (leaves made before the failure stay; they are harmless).
pub fn reserve(start: usize, len: usize) -> bool {
    debug_assert!(start % GRANULE == 0 && len % GRANULE == 0);
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    if end > ADDR_LIMIT {
        return false;
    }
    let mut a = start;
    while a < end {
        let (t, _) = split(a);
        if leaf(t, true).is_none() {
            return false;
        }
        a = ((t + 1) << (LEAF_BITS + GRANULE_SHIFT)).min(end);
    }
    true
}

/// Leaves of the table that cover some of `[start, end)` (tests and diagnostics: a leaf is
/// 512 KiB of address space, mapped once for every 4 GiB of addresses ever registered).
pub fn leaves_in(start: usize, end: usize) -> usize {
    let end = end.min(ADDR_LIMIT);
    if start >= end {
        return 0;
    }
    let (first, _) = split(start);
    let (last, _) = split(end - 1);
    (first..=last)
        .filter(|&t| !TOP[t].load(Ordering::Acquire).is_null())
        .count()
}

/// Point every granule of `[start, start+len)` at `value` (0 clears). `start` and `len` must
/// be granule multiples and the range reserved ([`reserve`]) unless `value` is 0. Returns
/// whether every granule was set (false only for a range that was not reserved).
pub fn set_range(start: usize, len: usize, value: usize) -> bool {
    debug_assert!(start % GRANULE == 0 && len % GRANULE == 0);
    let end = start.saturating_add(len).min(ADDR_LIMIT);
    let mut all = start.saturating_add(len) <= ADDR_LIMIT;
    let mut a = start;
    while a < end {
        let (t, l) = split(a);
        match leaf(t, false) {
            Some(leaf) => leaf[l].store(value, Ordering::Release),
            None => all &= value == 0,
        }
        a += GRANULE;
    }
    debug_assert!(all, "set_range on a range that was not reserved");
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let base = 0x5a5a_0000_0000usize;
        assert_eq!(get(base), 0);
        assert!(reserve(base, 3 * GRANULE));
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
        assert!(!reserve(ADDR_LIMIT - GRANULE, 2 * GRANULE));
        assert!(!reserve(usize::MAX - GRANULE + 1, GRANULE));
        assert!(
            set_range(0x7000_0000_0000, GRANULE, 0),
            "clearing needs no leaf"
        );
    }

    #[test]
    fn crosses_a_leaf_boundary() {
        let leaf_span = 1usize << (LEAF_BITS + GRANULE_SHIFT);
        let base = 0x3b00_0000_0000usize + leaf_span - GRANULE;
        assert!(reserve(base, 2 * GRANULE));
        assert!(set_range(base, 2 * GRANULE, 16));
        assert_eq!(get(base), 16);
        assert_eq!(get(base + GRANULE), 16);
        assert!(set_range(base, 2 * GRANULE, 0));
    }
}
