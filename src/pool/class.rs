//! Size classes: which slot size serves a small request, for one alignment.

use super::{SLAB_MAX, SMALL_MAX};
use crate::registry::GRANULE;

/// Size classes for one alignment.
pub struct ClassTable {
    pub(super) align: usize,
    pub(super) align_shift: u32,
    pub(super) sizes: Vec<usize>,
    pub(super) slab_bytes: Vec<usize>,
    /// Class index by `ceil(n / align)`, for `n <= SMALL_MAX`.
    pub(super) lookup: Vec<u8>,
}

impl ClassTable {
    pub fn new(align: usize) -> Self {
        assert!(align.is_power_of_two() && (16..=GRANULE).contains(&align));
        let mut sizes: Vec<usize> = (1..=8)
            .map(|k| k * align)
            .filter(|&s| s <= SMALL_MAX)
            .collect();
        let mut base = 8 * align;
        while base < SMALL_MAX {
            for m in [5, 6, 7, 8] {
                let s = (base * m / 4).next_multiple_of(align);
                if s <= SMALL_MAX && s > *sizes.last().unwrap() {
                    sizes.push(s);
                }
            }
            base *= 2;
        }
        assert!(sizes.len() < 256);
        let slab_bytes = sizes
            .iter()
            .map(|&s| (s * 32).next_power_of_two().clamp(GRANULE, SLAB_MAX))
            .collect();
        let mut lookup = vec![0u8; SMALL_MAX / align + 1];
        let mut ci = 0;
        for (q, slot) in lookup.iter_mut().enumerate() {
            while sizes[ci] < q * align {
                ci += 1;
            }
            *slot = ci as u8;
        }
        ClassTable {
            align,
            align_shift: align.trailing_zeros(),
            sizes,
            slab_bytes,
            lookup,
        }
    }

    /// The class serving `n` bytes (`n <= SMALL_MAX`).
    #[inline]
    pub fn class_of(&self, n: usize) -> usize {
        self.lookup[(n + self.align - 1) >> self.align_shift] as usize
    }

    pub fn size(&self, ci: usize) -> usize {
        self.sizes[ci]
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}
