//! The decay part of a pool: how long a wholly free chunk above `retain` is kept before it goes
//! back, and when the first waiting one is due.

use super::clock::epoch_ms;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Default)]
pub(crate) struct Decay {
    /// Milliseconds a wholly free chunk waits (0: it goes back at once). For memory that is
    /// costly to make, such as pinned host memory.
    ms: AtomicU64,
    /// The clock's milliseconds (`epoch_ms`) when idle chunks are next due to go back (0: none
    /// waiting).
    due: AtomicU64,
}

impl Decay {
    /// Keep wholly free chunks for `d` before they go back.
    pub(crate) fn set(&self, d: Duration) {
        self.ms.store(d.as_millis() as u64, Ordering::Relaxed);
    }

    /// How long wholly free chunks wait (None: they go back at once).
    pub(crate) fn get(&self) -> Option<Duration> {
        match self.ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// The first waiting chunk is due at `at`.
    pub(crate) fn set_due(&self, at: Instant) {
        self.due.store(epoch_ms(at), Ordering::Relaxed);
    }

    /// No chunk waits.
    pub(crate) fn clear_due(&self) {
        if self.due.load(Ordering::Relaxed) != 0 {
            self.due.store(0, Ordering::Relaxed);
        }
    }

    /// Whether chunks wait and the first is due (cheap when none wait).
    #[inline]
    pub(crate) fn is_due(&self) -> bool {
        let due = self.due.load(Ordering::Relaxed);
        due != 0 && epoch_ms(Instant::now()) >= due
    }
}
