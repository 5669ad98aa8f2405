//! The state of each consumer's integration, below the C contract (`crate::ffi`, which only
//! marshals): PyTorch's segments route (which import slots are hooked, and what they held),
//! NumPy's dispatch handler (whether it allocates from ump-alloc, and the handler it stands in
//! for), CuPy's fast path (whether the last allocation failed, for the allocator to raise).

pub mod cupy;
pub mod numpy;
pub mod torch;
