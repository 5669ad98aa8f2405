//! The pool's coarse clock: milliseconds since the first reading, for deadlines kept in an
//! atomic word (the decay of idle chunks, purges of lazily committed pages, dead slabs).

use std::sync::OnceLock;
use std::time::Instant;

/// The clock `epoch_ms` counts from.
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Milliseconds from the clock's start to `t`, plus one (so 0 can mean "never").
pub(crate) fn epoch_ms(t: Instant) -> u64 {
    let e = *EPOCH.get_or_init(Instant::now);
    t.saturating_duration_since(e).as_millis() as u64 + 1
}
