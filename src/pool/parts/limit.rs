//! The limit on a pool's mapped bytes, as RMM's limiting adaptor wraps a resource: bytes are
//! charged against the pool's counters *before* the backing maps them, so that threads mapping
//! at once cannot pass the limit together, and a [`Charge`] that is not kept is given back.

use crate::error::{Error, Result};
use crate::pool::stats::PoolStats;
use std::sync::atomic::Ordering;

/// A bound on mapped bytes, and what set it (named in the error when it is reached).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub bytes: usize,
    pub source: &'static str,
}

impl Limit {
    /// The limit `UMP_ALLOC_LIMIT` sets.
    pub fn configured(bytes: usize) -> Limit {
        Limit {
            bytes,
            source: "UMP_ALLOC_LIMIT",
        }
    }
}

/// Bytes counted as mapped ahead of the mapping. Dropped without [`keep`](Self::keep) (the
/// backing refused), they are uncounted again.
#[must_use = "a charge not kept is given back at once"]
pub(crate) struct Charge<'a> {
    stats: &'a PoolStats,
    n: usize,
}

impl<'a> Charge<'a> {
    /// Count `n` more bytes mapped in `stats`, if that keeps them within `limit`; `need` is
    /// what the caller needs at least, for the error. Nothing is counted for 0 bytes.
    pub(crate) fn new(
        stats: &'a PoolStats,
        n: usize,
        limit: Option<Limit>,
        need: usize,
    ) -> Result<Charge<'a>> {
        if let Some(c) = Charge::within(stats, n, limit) {
            return Ok(c);
        }
        let mapped = stats.mapped.load(Ordering::Relaxed);
        let Limit { bytes, source } = limit.unwrap_or(Limit {
            bytes: 0,
            source: "the limit",
        });
        Err(Error::limit(format!(
            "{source} of {bytes} bytes reached ({mapped} mapped, {need} more needed)"
        )))
    }

    /// As [`new`](Self::new), for a caller that tries something else when the limit refuses
    /// (no error is made).
    pub(crate) fn within(
        stats: &'a PoolStats,
        n: usize,
        limit: Option<Limit>,
    ) -> Option<Charge<'a>> {
        // `then`, not `then_some`: a Charge made and dropped would give back bytes never counted.
        (n == 0 || stats.reserve_mapped(n, limit.map(|l| l.bytes))).then(|| Charge { stats, n })
    }

    /// The bytes are mapped: they stay counted.
    pub(crate) fn keep(self) {
        std::mem::forget(self);
    }

    /// `actual` bytes were mapped instead of the bytes charged: count those.
    pub(crate) fn keep_as(self, actual: usize) {
        if actual != self.n {
            self.stats.on_unmap(self.n);
            self.stats.on_map(actual);
        }
        self.keep();
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.n > 0 {
            self.stats.on_unmap(self.n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorClass, Status};

    fn mapped(s: &PoolStats) -> usize {
        s.mapped.load(Ordering::Relaxed)
    }

    #[test]
    fn a_charge_is_counted_until_dropped_unless_kept() {
        let s = PoolStats::default();
        let lim = Some(Limit {
            bytes: 10_000,
            source: "UMP_ALLOC_LIMIT",
        });
        let c = Charge::new(&s, 4096, lim, 4096).unwrap();
        assert_eq!(mapped(&s), 4096);
        drop(c);
        assert_eq!(mapped(&s), 0, "the backing refused: uncounted");
        Charge::new(&s, 4096, lim, 4096).unwrap().keep();
        Charge::new(&s, 4096, lim, 4096).unwrap().keep_as(3000);
        assert_eq!(mapped(&s), 7096);
    }

    #[test]
    fn past_the_limit_nothing_is_counted_and_the_error_names_its_source() {
        let s = PoolStats::default();
        let lim = Some(Limit {
            bytes: 8192,
            source: "UMP_ALLOC_LIMIT",
        });
        Charge::new(&s, 8192, lim, 8192).unwrap().keep();
        let e = Charge::new(&s, 1, lim, 1).err().expect("over the limit");
        assert_eq!(
            (e.status, e.class),
            (Status::UMP_ERR_OOM, ErrorClass::Limit)
        );
        assert!(
            e.msg
                .contains("UMP_ALLOC_LIMIT of 8192 bytes reached (8192 mapped, 1 more needed)"),
            "{}",
            e.msg
        );
        assert_eq!(mapped(&s), 8192);
        // Refused quietly (a caller with something else to try): nothing counted or uncounted.
        assert!(Charge::within(&s, 1, lim).is_none());
        assert_eq!(mapped(&s), 8192);
        // Nothing to map is never refused, even at the limit.
        Charge::new(&s, 0, lim, 0).unwrap().keep();
        // No limit: always counted.
        Charge::new(&s, 1 << 40, None, 1).unwrap().keep();
        assert_eq!(mapped(&s), 8192 + (1 << 40));
    }
}
