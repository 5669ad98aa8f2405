//! Size classes: which slot size serves a small request, for one alignment.
//!
//! The alignment (512 by default, CuPy's allocation unit) is what a block that can hold a
//! GPU-worthy array needs. On the host side (NumPy, the C malloc family) a block *smaller* than
//! the alignment does not pay for it: its class is one of 16, 32, 48, 64, 80, 96, 112, 128,
//! then four steps per power of two, and a slot of size `s` is aligned to the largest power of
//! two dividing `s` (at least 16), since slabs start on a granule and slots follow each other.
//! From the alignment up, every class is a multiple of the alignment: `1..=8` times it, then
//! four steps per power of two. Device-side pools (CuPy, PyTorch) give every block the full
//! alignment: GPU code may assume it of any device pointer.

use crate::registry::GRANULE;

/// Largest request served from slabs; larger ones get spans of their own.
pub(crate) const SMALL_MAX: usize = 256 << 10;
/// Largest slab.
pub(crate) const SLAB_MAX: usize = 4 << 20;

/// The smallest slot, and the granularity of the class lookup table.
pub(crate) const MIN_SLOT: usize = 16;
const MIN_SHIFT: u32 = MIN_SLOT.trailing_zeros();

/// Size classes for one alignment.
pub struct ClassTable {
    pub(super) align: usize,
    pub(super) sizes: Vec<usize>,
    pub(super) slab_bytes: Vec<usize>,
    /// Class index by `ceil(n / MIN_SLOT)`, for `n <= SMALL_MAX`.
    lookup: Vec<u8>,
}

/// Four steps per power of two from `from` (exclusive) up to `to` (inclusive), each rounded up
/// to a multiple of `unit`.
fn geometric(from: usize, to: usize, unit: usize, out: &mut Vec<usize>) {
    let mut base = from;
    while base < to {
        for m in [5, 6, 7, 8] {
            let s = (base * m / 4).next_multiple_of(unit);
            if s <= to && out.last().is_none_or(|&l| s > l) {
                out.push(s);
            }
        }
        base *= 2;
    }
}

impl ClassTable {
    /// The classes for `align`; with `natural_small`, blocks smaller than `align` get classes
    /// of their own with their natural alignment (host side).
    pub fn new(align: usize, natural_small: bool) -> Self {
        assert!(align.is_power_of_two() && (MIN_SLOT..=GRANULE).contains(&align));
        // Below the alignment: 16..=128 in steps of 16, then geometric, all below `align`.
        let mut sizes: Vec<usize> = (1..=8)
            .map(|k| k * MIN_SLOT)
            .filter(|&s| natural_small && s < align)
            .collect();
        if natural_small && 8 * MIN_SLOT < align {
            geometric(8 * MIN_SLOT, align - 1, MIN_SLOT, &mut sizes);
        }
        // From the alignment up: 1..=8 times it, then geometric.
        for k in 1..=8 {
            let s = k * align;
            if s <= SMALL_MAX && sizes.last().is_none_or(|&l| s > l) {
                sizes.push(s);
            }
        }
        geometric(8 * align, SMALL_MAX, align, &mut sizes);
        assert_eq!(*sizes.last().unwrap(), SMALL_MAX);
        assert!(sizes.len() < 256);
        let slab_bytes = sizes
            .iter()
            .map(|&s| (s * 32).next_power_of_two().clamp(GRANULE, SLAB_MAX))
            .collect();
        let mut lookup = vec![0u8; (SMALL_MAX >> MIN_SHIFT) + 1];
        let mut ci = 0;
        for (q, slot) in lookup.iter_mut().enumerate() {
            while sizes[ci] < q << MIN_SHIFT {
                ci += 1;
            }
            *slot = ci as u8;
        }
        ClassTable {
            align,
            sizes,
            slab_bytes,
            lookup,
        }
    }

    /// The class serving `n` bytes (`n <= SMALL_MAX`).
    #[inline]
    pub fn class_of(&self, n: usize) -> usize {
        self.lookup[(n + MIN_SLOT - 1) >> MIN_SHIFT] as usize
    }

    /// [`class_of`](Self::class_of) without the bounds check (the allocation fast path).
    ///
    /// # Safety
    /// `n <= SMALL_MAX`: the lookup table covers exactly those sizes.
    #[inline(always)]
    pub(super) unsafe fn class_of_unchecked(&self, n: usize) -> usize {
        debug_assert!(n <= SMALL_MAX);
        // SAFETY: `n <= SMALL_MAX` (the caller's contract), and the table has an entry for
        // every `ceil(n / MIN_SLOT)` up to `SMALL_MAX / MIN_SLOT`.
        unsafe { *self.lookup.get_unchecked((n + MIN_SLOT - 1) >> MIN_SHIFT) as usize }
    }

    pub fn size(&self, ci: usize) -> usize {
        self.sizes[ci]
    }

    /// The alignment every block of class `ci` has: the pool's alignment, or for a class
    /// below it the largest power of two dividing the slot size.
    pub fn alignment_of(&self, ci: usize) -> usize {
        let s = self.sizes[ci];
        (1usize << s.trailing_zeros()).min(self.align)
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}
