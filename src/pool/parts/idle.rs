//! The wholly free chunks of a pool, its *idle set*: what can go back to the backing or to
//! another stream's pool. Keyed by (length, base), with the bytes they hold and, for a pool with
//! a decay, when each fell idle. Generic over what the pool keeps for a chunk (its span), so
//! that it needs nothing of the pool.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub(crate) struct IdleChunks<T> {
    by_size: BTreeMap<(usize, usize), T>,
    bytes: usize,
    /// Base -> when the chunk fell idle (pools with a decay only).
    since: BTreeMap<usize, Instant>,
}

impl<T> Default for IdleChunks<T> {
    fn default() -> Self {
        IdleChunks {
            by_size: BTreeMap::new(),
            bytes: 0,
            since: BTreeMap::new(),
        }
    }
}

impl<T: Copy> IdleChunks<T> {
    /// The chunk `key` = (length, base) fell idle, kept as `v`; `since`: when, for a pool with a
    /// decay.
    pub(crate) fn insert(&mut self, key: (usize, usize), v: T, since: Option<Instant>) {
        self.by_size.insert(key, v);
        self.bytes += key.0;
        if let Some(t) = since {
            self.since.insert(key.1, t);
        }
    }

    /// The chunk `key` is idle no more (used again, or gone). Returns whether it was idle.
    pub(crate) fn remove(&mut self, key: (usize, usize)) -> bool {
        if self.by_size.remove(&key).is_none() {
            return false;
        }
        self.bytes -= key.0;
        self.since.remove(&key.1);
        true
    }

    /// Bytes of the idle chunks.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_size.is_empty()
    }

    /// The largest idle chunk.
    pub(crate) fn largest(&self) -> Option<T> {
        self.by_size.values().next_back().copied()
    }

    /// The smallest idle chunk.
    pub(crate) fn smallest(&self) -> Option<T> {
        self.by_size.values().next().copied()
    }

    /// The smallest idle chunk of at least `min` bytes.
    pub(crate) fn smallest_at_least(&self, min: usize) -> Option<T> {
        self.by_size.range((min, 0)..).next().map(|(_, &v)| v)
    }

    /// The largest chunk idle for `d` or longer at `now` (one with no time counts as idle long
    /// enough).
    pub(crate) fn largest_expired(&self, now: Instant, d: Duration) -> Option<T> {
        self.by_size
            .iter()
            .rev()
            .find(|(key, _)| {
                self.since
                    .get(&key.1)
                    .is_none_or(|&t| now.duration_since(t) >= d)
            })
            .map(|(_, &v)| v)
    }

    /// When the chunk idle the longest fell idle (pools with a decay).
    pub(crate) fn oldest(&self) -> Option<Instant> {
        self.since.values().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::IdleChunks;
    use std::time::{Duration, Instant};

    #[test]
    fn the_set_answers_by_size_and_by_age() {
        let mut s = IdleChunks::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_millis(50);
        s.insert((64, 0x1000), 'a', Some(t0));
        s.insert((128, 0x9000), 'b', Some(later));
        s.insert((32, 0x5000), 'c', None);
        assert_eq!(
            (s.bytes(), s.largest(), s.smallest()),
            (224, Some('b'), Some('c'))
        );
        assert_eq!(s.smallest_at_least(40), Some('a'));
        assert_eq!(s.smallest_at_least(129), None);
        assert_eq!(s.oldest(), Some(t0));
        // At `later`, 'a' has been idle 50 ms and 'b' not at all; 'c' has no time.
        let d = Duration::from_millis(40);
        assert_eq!(s.largest_expired(later, d), Some('a'));
        assert!(s.remove((64, 0x1000)) && !s.remove((64, 0x1000)));
        assert_eq!(s.largest_expired(later, d), Some('c'));
        assert_eq!((s.bytes(), s.oldest()), (160, Some(later)));
        assert!(s.remove((128, 0x9000)) && s.remove((32, 0x5000)) && s.is_empty());
        assert_eq!((s.bytes(), s.oldest()), (0, None));
    }
}
