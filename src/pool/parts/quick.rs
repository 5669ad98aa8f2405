//! The exact-size list of a pool: freed spans kept whole, oldest first, so that a request of
//! the same size takes one back without a search or a split (the free set merges them only
//! when the list is full, a retain bound is passed, or a request finds nothing else). Keeps
//! each span's length with it and the bytes of them all. Generic over what the pool keeps for
//! a span, so that it needs nothing of the pool.

use std::collections::VecDeque;

pub(crate) struct QuickList<T> {
    /// (length, span), oldest first.
    list: VecDeque<(usize, T)>,
    bytes: usize,
}

impl<T> Default for QuickList<T> {
    fn default() -> Self {
        QuickList {
            list: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<T: Copy> QuickList<T> {
    /// Keep `v`, a freed span of `len` bytes, as the newest.
    pub(crate) fn push(&mut self, len: usize, v: T) {
        self.list.push_back((len, v));
        self.bytes += len;
    }

    /// Whether it holds more than `count` spans or `bytes` bytes.
    pub(crate) fn over(&self, count: usize, bytes: usize) -> bool {
        self.list.len() > count || self.bytes > bytes
    }

    /// The oldest span, taken off the list.
    pub(crate) fn pop_oldest(&mut self) -> Option<T> {
        let (len, v) = self.list.pop_front()?;
        self.bytes -= len;
        Some(v)
    }

    /// The newest span of exactly `len` bytes, taken off the list.
    pub(crate) fn take_newest_of_len(&mut self, len: usize) -> Option<T> {
        let i = self.list.iter().rposition(|e| e.0 == len)?;
        self.take_at(i)
    }

    /// The first span for which `is` holds, taken off the list.
    pub(crate) fn take_where(&mut self, is: impl Fn(T) -> bool) -> Option<T> {
        let i = self.list.iter().position(|e| is(e.1))?;
        self.take_at(i)
    }

    /// Whether `is` holds for a span on the list.
    pub(crate) fn contains_where(&self, is: impl Fn(T) -> bool) -> bool {
        self.list.iter().any(|e| is(e.1))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Bytes of the spans on the list.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The spans, oldest first.
    pub(crate) fn values(&self) -> impl Iterator<Item = T> + '_ {
        self.list.iter().map(|e| e.1)
    }

    fn take_at(&mut self, i: usize) -> Option<T> {
        let (len, v) = self.list.remove(i)?;
        self.bytes -= len;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::QuickList;

    #[test]
    fn spans_come_back_by_size_age_and_identity_with_their_bytes() {
        let mut q = QuickList::default();
        q.push(64, 'a');
        q.push(32, 'b');
        q.push(64, 'c');
        assert_eq!(q.bytes(), 160);
        assert!(q.over(2, usize::MAX) && q.over(3, 159) && !q.over(3, 160));
        assert_eq!(q.take_newest_of_len(64), Some('c'));
        assert_eq!(q.take_newest_of_len(48), None);
        assert!(q.contains_where(|v| v == 'b') && !q.contains_where(|v| v == 'c'));
        assert_eq!(q.take_where(|v| v == 'b'), Some('b'));
        assert_eq!((q.bytes(), q.values().collect::<Vec<_>>()), (64, vec!['a']));
        assert_eq!(q.pop_oldest(), Some('a'));
        assert!(q.is_empty() && q.bytes() == 0 && q.pop_oldest().is_none());
    }
}
