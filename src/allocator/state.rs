//! The allocator's state: what initialisation fixes (`Allocator`) and what depends on the
//! machine's capabilities (`Gpu`). The files beside it act on it; `mod.rs` only names what the
//! crate uses.

use crate::config::Config;
use crate::host::HostPools;
use crate::mode::{Mode, Selection};
use crate::pool::{Pool, PoolStats};
use crate::prim::cuda::MachineCaps;
use crate::stream::StreamPools;
use std::sync::{Mutex, OnceLock};

/// The fixed state after initialisation.
pub struct Allocator {
    pub config: Config,
    pub alignment: usize,
    pub(super) host: HostPools,
    /// What needs the machine's capabilities: the sides, and the device side's pools. Made at
    /// initialisation, except where the host side needs no GPU and the device side is left to
    /// `auto` (a plain host side): then at the first use of the device side or a question
    /// about the mode, so that a program that never touches a GPU loads no CUDA driver (no
    /// driver threads, and fork children free to initialise CUDA themselves).
    pub(super) gpu: OnceLock<Gpu>,
    /// The host side was chosen pinned before the machine was asked (see
    /// `host_side_without_caps`): the machine's answer may differ.
    pub(super) provisional: bool,
    pub(super) device_pool_lock: Mutex<()>,
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
    pub(super) hmm: bool,
    pub(super) devices: Vec<OnceLock<&'static StreamPools>>,
    /// PyTorch's segments where they are plain device memory apart from the device side
    /// (`UMP_ALLOC_TORCH_SEGMENTS`), per device.
    pub(super) segments: Vec<OnceLock<&'static StreamPools>>,
    /// The counters a device's pool sets share (both count against one `UMP_ALLOC_LIMIT`).
    pub(super) device_stats: Vec<OnceLock<&'static PoolStats>>,
}

impl Gpu {
    pub(super) fn new(caps: MachineCaps, selection: Selection) -> Gpu {
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
