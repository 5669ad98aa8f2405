//! A chunk that grows in the room reserved after it, step after step, as pinned chunks do
//! (`Backing::grow` with a stand-in backing).

use super::*;
use crate::backing::{ARENA, Backing, Chunk, Growth, RangeBook};
use crate::error::Result;
use crate::pool::lookup;
use crate::prim::os;

/// Pinned memory's growth rules without CUDA: chunks of their own sit in 8x their size of
/// address space and grow into it in place.
struct Room;
impl Backing for Room {
    fn kind(&self) -> Kind {
        Kind::UMP_KIND_REGISTERED
    }
    fn device(&self) -> i32 {
        -1
    }
    fn map(&self, size: usize) -> Result<Chunk> {
        let raw_size = if size >= ARENA / 2 { size * 8 } else { size };
        let p = os::reserve(raw_size, GRANULE).unwrap().as_ptr();
        assert!(os::commit(p, size));
        let base = p as usize;
        Ok(Chunk::mapped(base, size, raw_size))
    }
    unsafe fn unmap(&self, c: &Chunk) {
        // SAFETY: ours, unused.
        unsafe {
            os::unmap(
                std::ptr::NonNull::new(c.raw as *mut u8).unwrap(),
                c.raw_size,
            )
        };
    }
    unsafe fn grow(&self, c: &Chunk, size: usize, book: &mut dyn RangeBook) -> Growth {
        if size <= c.size || c.base + size > c.raw + c.raw_size || !book.claim(c.base, size) {
            return Growth::Refused;
        }
        assert!(os::commit((c.base + c.size) as *mut u8, size - c.size));
        Growth::Grown(Chunk { size, ..*c })
    }
}

#[test]
fn pinned_style_chunks_grow_in_their_room_step_after_step() {
    let p = Pool::new(Box::new(Room), 512, None, 256 << 20);
    let mut n = (8 << 20) * 4;
    let mut ptr = p.alloc(n).unwrap().ptr;
    for step in 1..=5 {
        let m = n + n / 2 + step * 12345 * 4;
        let info = lookup(ptr).unwrap();
        let r = p.resize_in_place(&info, m);
        assert!(r.is_some(), "step {step}: {n} -> {m} copies");
        ptr = r.unwrap();
        n = m;
    }
    p.free(ptr).unwrap();
    p.trim();
}
