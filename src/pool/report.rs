//! What a pool reports: a snapshot of what it maps, reserves and caches, and its largest free
//! span.

use super::tcache;
use super::types::{Pool, PoolReport};
use crate::prim::fork::lock;

impl Pool {
    /// What this pool holds now (read under its locks, one at a time: a snapshot per field).
    pub fn report(&'static self) -> PoolReport {
        let (mapped, reserved, largest_free) = {
            let lg = lock(&self.large);
            let largest = if self.lazy() {
                self.largest_committed_free(&lg)
            } else {
                lg.largest_free()
            };
            (self.mapped_of(&lg), lg.chunks.bytes(), largest)
        };
        PoolReport {
            stream: self.stream(),
            retired: self.is_retired(),
            mapped,
            reserved,
            cached: self.cached_bytes(),
            largest_free,
            kind: self.kind(),
        }
    }

    /// Bytes of free memory held in chunks, slabs and thread caches (mapped, not handed out).
    pub fn cached_bytes(&'static self) -> usize {
        let spans = {
            let lg = lock(&self.large);
            if self.lazy() {
                lg.lazy.free_committed()
            } else {
                lg.free_bytes()
            }
        };
        let slots: usize = self
            .classes
            .iter()
            .enumerate()
            .map(|(ci, c)| lock(c).free_slots() * self.table.sizes[ci])
            .sum();
        let threads = if self.is_stream_ordered() {
            self.hot_bytes()
        } else {
            tcache::cached_bytes(self)
        };
        spans + slots + threads
    }
}
