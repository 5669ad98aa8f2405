//! A batch of address ranges waiting for one driver call: the managed-memory discards a
//! stream pool issues together (see `residency`). Ranges are kept apart from memory handed
//! out again, so that a discard issued later never drops a live block's contents.

/// Ranges `(start, len)` and their bytes in all.
#[derive(Default)]
pub(crate) struct Batch {
    ranges: Vec<(usize, usize)>,
    bytes: usize,
}

impl Batch {
    /// Add `[a, a + n)`.
    pub(crate) fn push(&mut self, a: usize, n: usize) {
        self.ranges.push((a, n));
        self.bytes += n;
    }

    /// Whether it holds at least `count` ranges or `bytes` bytes.
    pub(crate) fn reaches(&self, count: usize, bytes: usize) -> bool {
        self.ranges.len() >= count || self.bytes >= bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Everything, taken out: the ranges and their bytes.
    pub(crate) fn take(&mut self) -> (Vec<(usize, usize)>, usize) {
        (
            std::mem::take(&mut self.ranges),
            std::mem::take(&mut self.bytes),
        )
    }

    /// Drop the ranges inside `[a, b)` (memory that goes back to the driver).
    pub(crate) fn forget(&mut self, a: usize, b: usize) {
        self.ranges.retain(|&(s, n)| s + n <= a || s >= b);
        self.recount();
    }

    /// Take `[a, b)` out, cutting the ranges that overlap it (memory handed out again).
    pub(crate) fn cut(&mut self, a: usize, b: usize) {
        if !self.ranges.iter().any(|&(s, n)| s < b && a < s + n) {
            return;
        }
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(s, n) in &self.ranges {
            let e = s + n;
            if e <= a || s >= b {
                kept.push((s, n));
                continue;
            }
            if s < a {
                kept.push((s, a - s));
            }
            if e > b {
                kept.push((b, e - b));
            }
        }
        self.ranges = kept;
        self.recount();
    }

    /// The ranges, oldest first.
    #[cfg(test)]
    pub(crate) fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges
    }

    fn recount(&mut self) {
        self.bytes = self.ranges.iter().map(|r| r.1).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::Batch;

    #[test]
    fn cut_keeps_the_pieces_outside_and_forget_drops_whole_ranges() {
        let mut b = Batch::default();
        b.push(0, 100);
        b.push(200, 100);
        assert!(b.reaches(2, usize::MAX) && !b.reaches(3, 201));
        b.cut(50, 250);
        let (r, n) = b.take();
        assert_eq!(r, vec![(0, 50), (250, 50)]);
        assert_eq!(n, 100);
        assert!(b.is_empty());
        b.push(0, 100);
        b.push(200, 100);
        b.forget(0, 150); // drops (0, 100) only: (200, 100) is outside
        assert_eq!(b.take(), (vec![(200, 100)], 100));
        b.push(0, 100);
        b.forget(50, 60); // overlapping but not inside: dropped as well (given back whole)
        assert_eq!(b.take(), (vec![], 0));
    }
}
