//! Backings: the resources at the bottom of the stack, in RMM's sense. Each hands out large
//! granule-aligned chunks of one kind of memory; the pool above sub-allocates them.
//! Host backings call `prim::os`; CUDA backings call `prim::cuda`. No policy lives here.
//!
//! The files, bottom up: the contract (`resource`), then plain host memory (`host`), the
//! driver's managed and device memory (`driver`), pinned host memory (`registered`, over
//! `shared`'s memory file) and the virtual-memory pool's space (`vmm`). This file only names
//! what the crate uses.

mod driver;
mod host;
pub mod registered;
mod resource;
pub mod shared;
pub mod vmm;

pub use driver::{DeviceBacking, ManagedBacking};
pub use host::HostBacking;
pub use registered::{
    RegisteredBacking, host_pinning_active, never_pin, pin_host_side, pinned, pinned_at,
    set_pinned_cap,
};
pub(crate) use resource::{ARENA, HUGEPAGE_MIN};
pub use resource::{Backing, Chunk, Growth, Kind, RangeBook, ump_kind};
pub use vmm::{Space, VmmBacking};
