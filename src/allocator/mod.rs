//! The allocator: one process-wide state that fixes the mode and the alignment at the first
//! allocation and composes a pool over the right backing for the host side (NumPy) and for
//! each device (CuPy, PyTorch). Safe Rust; the C contract sits in `ffi`, the driver in `prim`.
//!
//! This file holds the allocator's types; the rest is in parts: the process-wide state and
//! its initialisation (`init`), the settings made through the API before it (`settings`), the
//! sides chosen from the machine's capabilities and what they answer (`sides`), the device
//! side's pools (`pools`), blocks of either side (`blocks`), and the contracts on top (`malloc`,
//! `device`).

use crate::config::Config;
use crate::host::HostPools;
use crate::mode::{Mode, Selection};
use crate::pool::{Pool, PoolStats};
use crate::prim::cuda::MachineCaps;
use crate::stream::StreamPools;
use std::sync::{Mutex, OnceLock};

mod blocks;
mod device;
mod init;
mod malloc;
mod overrides;
mod pools;
mod settings;
mod sides;

pub use blocks::{block_at, check_device, owns, trim, use_gpu};
use blocks::{block_of, deferred_twice};
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

/// The fixed state after initialisation.
pub struct Allocator {
    pub config: Config,
    pub alignment: usize,
    host: HostPools,
    /// What needs the machine's capabilities: the sides, and the device side's pools. Made at
    /// initialisation, except where the host side needs no GPU and the device side is left to
    /// `auto` (a plain host side): then at the first use of the device side or a question
    /// about the mode, so that a program that never touches a GPU loads no CUDA driver (no
    /// driver threads, and fork children free to initialise CUDA themselves).
    gpu: OnceLock<Gpu>,
    /// The host side was chosen pinned before the machine was asked (see
    /// `host_side_without_caps`): the machine's answer may differ.
    provisional: bool,
    device_pool_lock: Mutex<()>,
}

/// The part of the allocator that depends on the machine's capabilities.
pub struct Gpu {
    pub caps: MachineCaps,
    /// The preset the sides make up (or `Custom`).
    pub mode: Mode,
    /// The sides and why each was chosen.
    pub selection: Selection,
    pub mode_reason: String,
    /// Every device reads pageable memory (HMM or ATS).
    hmm: bool,
    devices: Vec<OnceLock<&'static StreamPools>>,
    /// PyTorch's segments where they are plain device memory apart from the device side
    /// (`UMP_ALLOC_TORCH_SEGMENTS`), per device.
    segments: Vec<OnceLock<&'static StreamPools>>,
    /// The counters a device's pool sets share (both count against one `UMP_ALLOC_LIMIT`).
    device_stats: Vec<OnceLock<&'static PoolStats>>,
}

impl Gpu {
    fn new(caps: MachineCaps, selection: Selection) -> Gpu {
        /// One empty slot per device.
        fn per_device<T>(n: usize) -> Vec<OnceLock<T>> {
            (0..n).map(|_| OnceLock::new()).collect()
        }
        let n = caps.devices.len();
        Gpu {
            hmm: caps.pageable_everywhere(),
            devices: per_device(n),
            segments: per_device(n),
            device_stats: per_device(n),
            mode: selection.mode,
            mode_reason: selection.reason(),
            selection,
            caps,
        }
    }
}

impl Allocator {
    /// The pool behind NumPy and the C malloc family (the host side's own kind of memory).
    pub fn host_pool(&self) -> &'static Pool {
        self.host.primary()
    }

    /// The host side: its pool and its fallback.
    pub fn host(&self) -> &HostPools {
        &self.host
    }
}
