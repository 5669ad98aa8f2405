//! The allocator: one process-wide state that fixes the mode and the alignment at the first
//! allocation and composes a pool over the right backing for the host side (NumPy) and for
//! each device (CuPy, PyTorch). Safe Rust; the C contract sits in `ffi`, the driver in `prim`.
//!
//! The files, bottom up: the state (`state`: `Allocator` and `Gpu`); its initialisation
//! (`init`), the settings made through the API before it (`settings`), the
//! sides chosen from the machine's capabilities and what they answer (`sides`), the device
//! side's pools (`pools`), blocks of either side (`blocks`), and the contracts on top (`malloc`,
//! `device`). This file only names what the crate uses.

mod blocks;
mod device;
mod init;
mod malloc;
mod overrides;
mod pools;
mod settings;
mod sides;
mod state;

pub use blocks::{block_at, check_device, owns, trim, use_gpu};
pub use device::{
    device_free, device_malloc, device_memory_info, device_record_stream, device_trim,
    segment_free, segment_malloc, set_device_fraction,
};
pub use init::{caps, check, config, env_config, get, init, instance};
pub use malloc::{
    block_alignment, calloc, free, free_cached, malloc, malloc_cached, realloc, realloc_cached,
    set_enomem,
};
pub use pools::set_segment_memory;
pub(crate) use settings::fork_lock_settings;
pub use settings::{set_alignment, set_limit, set_mode};
pub use sides::{fork_rule, selection};
pub use state::{Allocator, Gpu};
