//! The free set of a pool: its free spans by (length, start), so that the best fit for a
//! request is the first at or after (length, 0), O(log n) in the number of free spans, and the
//! bytes they hold. Generic over what the pool keeps for a span, so that it needs nothing of
//! the pool.

use std::collections::BTreeMap;

pub(crate) struct FreeSpans<T> {
    by_size: BTreeMap<(usize, usize), T>,
    bytes: usize,
}

impl<T> Default for FreeSpans<T> {
    fn default() -> Self {
        FreeSpans {
            by_size: BTreeMap::new(),
            bytes: 0,
        }
    }
}

impl<T: Copy> FreeSpans<T> {
    /// The span `key` = (length, start) is free, kept as `v`.
    pub(crate) fn insert(&mut self, key: (usize, usize), v: T) {
        self.by_size.insert(key, v);
        self.bytes += key.0;
    }

    /// The span `key` is free no more. Returns whether it was in the set.
    pub(crate) fn remove(&mut self, key: (usize, usize)) -> bool {
        if self.by_size.remove(&key).is_none() {
            return false;
        }
        self.bytes -= key.0;
        true
    }

    /// Whether the span `key` is in the set.
    pub(crate) fn contains(&self, key: (usize, usize)) -> bool {
        self.by_size.contains_key(&key)
    }

    /// Free spans in the set.
    pub(crate) fn len(&self) -> usize {
        self.by_size.len()
    }

    /// Bytes of the free spans.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The length of the largest free span (0: none).
    pub(crate) fn largest_len(&self) -> usize {
        self.by_size.keys().next_back().map_or(0, |k| k.0)
    }

    /// Every free span, smallest first.
    pub(crate) fn values(&self) -> impl Iterator<Item = T> + '_ {
        self.by_size.values().copied()
    }

    /// The free spans of exactly `len` bytes, lowest start first.
    pub(crate) fn of_len(&self, len: usize) -> impl Iterator<Item = T> + '_ {
        self.by_size
            .range((len, 0)..=(len, usize::MAX))
            .map(|(_, &v)| v)
    }

    /// The free spans of at least `len` bytes, tightest first (the best fit is the first).
    pub(crate) fn fits(&self, len: usize) -> impl Iterator<Item = T> + '_ {
        self.by_size.range((len, 0)..).map(|(_, &v)| v)
    }
}

#[cfg(test)]
mod tests {
    use super::FreeSpans;

    #[test]
    fn the_best_fit_is_the_tightest_and_the_bytes_follow() {
        let mut f = FreeSpans::default();
        f.insert((64, 0x4000), 'a');
        f.insert((64, 0x1000), 'b');
        f.insert((256, 0x8000), 'c');
        assert_eq!((f.len(), f.bytes(), f.largest_len()), (3, 384, 256));
        // Equal lengths: the lower address first.
        assert_eq!(f.fits(60).collect::<Vec<_>>(), vec!['b', 'a', 'c']);
        assert_eq!(f.fits(65).next(), Some('c'));
        assert_eq!(f.fits(257).next(), None);
        assert_eq!(f.of_len(64).collect::<Vec<_>>(), vec!['b', 'a']);
        assert_eq!(f.of_len(128).next(), None);
        assert!(f.contains((64, 0x4000)) && !f.contains((64, 0x2000)));
        assert!(f.remove((64, 0x1000)) && !f.remove((64, 0x1000)));
        assert_eq!(
            (f.bytes(), f.values().collect::<Vec<_>>()),
            (320, vec!['a', 'c'])
        );
        assert!(f.remove((64, 0x4000)) && f.remove((256, 0x8000)));
        assert_eq!((f.len(), f.bytes(), f.largest_len()), (0, 0, 0));
    }
}
