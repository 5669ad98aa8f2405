//! The chunk list of a pool, an owned part: the chunks it holds, by base, and their bytes.

use crate::backing::Chunk;
use std::collections::BTreeMap;

#[derive(Default)]
pub(crate) struct Chunks {
    by_base: BTreeMap<usize, Chunk>,
    /// The sum of the chunks' sizes.
    bytes: usize,
}

impl Chunks {
    /// Hold `chunk` (in place of one at the same base, if any).
    pub(crate) fn insert(&mut self, chunk: Chunk) {
        if let Some(old) = self.by_base.insert(chunk.base, chunk) {
            self.bytes -= old.size;
        }
        self.bytes += chunk.size;
    }

    /// The chunk at `base`, no longer held.
    pub(crate) fn remove(&mut self, base: usize) -> Option<Chunk> {
        let c = self.by_base.remove(&base)?;
        self.bytes -= c.size;
        Some(c)
    }

    /// The chunk at `base`.
    pub(crate) fn get(&self, base: usize) -> Option<Chunk> {
        self.by_base.get(&base).copied()
    }

    /// The chunk at `base` if huge-page advice was not given for it yet; it counts as given
    /// from now on.
    pub(crate) fn first_advice(&mut self, base: usize) -> Option<Chunk> {
        let c = self.by_base.get_mut(&base).filter(|c| !c.advised)?;
        c.advised = true;
        Some(*c)
    }

    /// Whether no chunk is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_base.is_empty()
    }

    /// Bytes of the chunks held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_follow_inserts_replacements_and_removals() {
        let mut l = Chunks::default();
        assert!(l.is_empty());
        l.insert(Chunk::mapped(0x1000, 4096, 4096));
        l.insert(Chunk::mapped(0x10000, 8192, 8192));
        assert_eq!(l.bytes(), 12288);
        // A chunk grown or shrunk in place is inserted again at its base.
        l.insert(Chunk::mapped(0x10000, 16384, 16384));
        assert_eq!(l.bytes(), 20480);
        assert_eq!(l.remove(0x1000).map(|c| c.size), Some(4096));
        assert_eq!(l.remove(0x1000).map(|c| c.size), None);
        assert_eq!(l.bytes(), 16384);
        assert_eq!(l.get(0x10000).map(|c| c.size), Some(16384));
    }

    #[test]
    fn huge_page_advice_is_given_once_per_chunk() {
        let mut l = Chunks::default();
        l.insert(Chunk::mapped(0x200000, 1 << 21, 1 << 21));
        assert_eq!(l.first_advice(0x200000).map(|c| c.base), Some(0x200000));
        assert!(l.first_advice(0x200000).is_none());
        assert!(l.get(0x200000).is_some_and(|c| c.advised));
        assert!(l.first_advice(0x400000).is_none(), "no such chunk");
    }
}
