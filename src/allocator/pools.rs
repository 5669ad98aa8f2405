//! The device side's pools: the stream pools of each device, made on first use over the
//! side's memory, and those of PyTorch's segments where they are plain device memory of their
//! own (`UMP_ALLOC_TORCH_SEGMENTS`, or `set_segment_memory` at run time).

use super::state::Allocator;
use crate::backing::{
    Backing, DeviceBacking, HostBacking, Kind, ManagedBacking, RegisteredBacking, Space, VmmBacking,
};
use crate::config;
use crate::error::{Error, Result};
use crate::mode::{DeviceSide, ModeRequest};
use crate::pool::{Pool, PoolStats};
use crate::prim::cuda;
use crate::prim::fork::{Held, lock};
use crate::stream::StreamPools;
use std::sync::OnceLock;

/// PyTorch's segment memory set at run time (`set_segment_memory`): an index into
/// [`SEGMENT_CHOICES`] (0: as configured).
static SEGMENTS_SET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
/// What `SEGMENTS_SET` stands for.
const SEGMENT_CHOICES: [Option<config::TorchSegments>; 3] = [
    None,
    Some(config::TorchSegments::Device),
    Some(config::TorchSegments::Side),
];

/// Choose the memory of PyTorch's segments from now on (`UMP_ALLOC_TORCH_SEGMENTS`'s values;
/// `auto` goes back to the configuration): segments already made stay where they are.
pub fn set_segment_memory(which: &str) -> Result<()> {
    let choice = config::TorchSegments::parse(which).ok_or_else(|| {
        Error::invalid(format!(
            "segment memory {which:?}: expected auto, device or side"
        ))
    })?;
    let i = SEGMENT_CHOICES
        .iter()
        .position(|&c| c == Some(choice))
        .unwrap_or(0);
    SEGMENTS_SET.store(i as u8, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

impl Allocator {
    /// The stream pools for GPU libraries on `device`, made on first use.
    pub fn device_pools(&self, device: i32) -> Result<&'static StreamPools> {
        let gpu = self.gpu();
        let side = gpu.selection.sides.device;
        self.pools_in(&gpu.devices, device, side, side == DeviceSide::Device)
    }

    /// The stream pools PyTorch's segments come from on `device`: plain device memory of
    /// their own, one driver allocation per segment, where [`segments_on_device`] says so
    /// (CUDA IPC exports them, as PyTorch's own), else the device side's.
    ///
    /// [`segments_on_device`]: Self::segments_on_device
    pub fn segment_pools(&self, device: i32) -> Result<&'static StreamPools> {
        let gpu = self.gpu();
        let side = gpu.selection.sides.device;
        if !self.segments_on_device() || (side == DeviceSide::Device && !self.config.device_vmm) {
            return self.device_pools(device);
        }
        self.pools_in(&gpu.segments, device, DeviceSide::Device, false)
    }

    /// Whether PyTorch's segments are plain device memory apart from the device side
    /// (`UMP_ALLOC_TORCH_SEGMENTS`, or `ump_torch_segment_memory` at run time).
    pub fn segments_on_device(&self) -> bool {
        use crate::config::TorchSegments as T;
        use crate::mode::SideRequest;
        let set = SEGMENTS_SET.load(std::sync::atomic::Ordering::Relaxed) as usize;
        let choice = SEGMENT_CHOICES
            .get(set)
            .copied()
            .flatten()
            .unwrap_or(self.config.torch_segments);
        let gpu = self.gpu();
        match choice {
            T::Device => gpu.selection.sides.device != DeviceSide::None,
            T::Side => false,
            T::Auto => {
                gpu.selection.sides.device == DeviceSide::Managed
                    && self.config.device_side == SideRequest::Auto
                    && self.config.mode == ModeRequest::Auto
                    && !self.config.torch_unified
            }
        }
    }

    /// The pools in `slots` for `device`, made on first use over memory of `side` (`vmm`: a
    /// virtual-memory pool for plain device memory, where the driver has one).
    fn pools_in(
        &self,
        slots: &[OnceLock<&'static StreamPools>],
        device: i32,
        side: DeviceSide,
        vmm: bool,
    ) -> Result<&'static StreamPools> {
        if cuda::fork_poisoned() {
            return Err(Error::unsupported(
                "GPU memory cannot be allocated in a fork() child of a process that used CUDA; \
                 start workers with multiprocessing's 'spawn' or 'forkserver' method",
            ));
        }
        let gpu = self.gpu();
        if side == DeviceSide::None {
            return Err(Error::unsupported(format!(
                "no GPU memory: the device side is 'none' ({})",
                gpu.selection.device_reason
            )));
        }
        let slot = crate::error::device_slot(slots, device)?;
        if let Some(p) = slot.get() {
            return Ok(p);
        }
        // Driver calls happen before the pool-set lock (the loader lock comes first in the
        // fork order); a space made by a thread that loses the race below stays unused.
        let space = if vmm { self.vmm_space(device) } else { None };
        let _g = lock(&self.device_pool_lock);
        if let Some(p) = slot.get() {
            return Ok(p);
        }
        let headroom = self.config.headroom;
        let oversubscribe = self.config.oversubscribe;
        type Make = Box<dyn Fn() -> Box<dyn Backing> + Send + Sync>;
        let (make, kind): (Make, Kind) = match side {
            DeviceSide::System => (
                Box::new(move || Box::new(HostBacking::for_device(Kind::UMP_KIND_SYSTEM, device))),
                Kind::UMP_KIND_SYSTEM,
            ),
            DeviceSide::Managed => (
                Box::new(move || Box::new(ManagedBacking::new(device, headroom, oversubscribe))),
                Kind::UMP_KIND_MANAGED,
            ),
            DeviceSide::Pinned => (
                Box::new(move || Box::new(RegisteredBacking::new(device))),
                Kind::UMP_KIND_REGISTERED,
            ),
            DeviceSide::Device | DeviceSide::None => match space {
                Some(space) => (
                    Box::new(move || Box::new(VmmBacking::new(space))),
                    Kind::UMP_KIND_DEVICE,
                ),
                None => (
                    Box::new(move || Box::new(DeviceBacking::new(device))),
                    Kind::UMP_KIND_DEVICE,
                ),
            },
        };
        let retain = if side == DeviceSide::System {
            self.config.host_retain
        } else {
            usize::MAX
        };
        // One set of counters per device, whichever of its pool sets comes first: the limit
        // bounds what the device's sets map together.
        let stats = *usize::try_from(device)
            .ok()
            .and_then(|i| gpu.device_stats.get(i))
            .expect("a device checked above")
            .get_or_init(|| {
                Box::leak(Box::new(PoolStats::with_parent(
                    crate::pool::stats::device_side(kind),
                )))
            });
        let g = StreamPools::new(
            device,
            make,
            self.alignment,
            self.config.limit,
            retain,
            cuda::available(),
            stats,
        );
        if side == DeviceSide::Managed {
            let memory = usize::try_from(device)
                .ok()
                .and_then(|i| gpu.caps.devices.get(i))
                .map_or(0, |d| d.total_memory as usize);
            g.set_managed_discard(self.config.managed_discard, memory);
        }
        let g = *slot.get_or_init(|| g);
        drop(_g);
        // The process's first device-side allocation on this device: it uses a GPU, so NumPy's
        // memory is pinned now, before the data is copied to the device.
        crate::backing::pin_host_side(Some(device));
        Ok(g)
    }

    /// The virtual-memory space of `device` for plain device memory, where the driver supports
    /// it and `UMP_ALLOC_DEVICE_VMM` is on; None degrades to chunks from `cuMemAlloc`.
    fn vmm_space(&self, device: i32) -> Option<&'static Space> {
        let caps = usize::try_from(device)
            .ok()
            .and_then(|i| self.gpu().caps.devices.get(i))?;
        if !self.config.device_vmm || !caps.virtual_memory {
            return None;
        }
        Space::for_device(device, caps.total_memory as usize).ok()
    }

    /// The stream pools `pool` belongs to (the device side's, or PyTorch's segments'), if it
    /// is a device pool.
    pub fn group_of(&self, pool: &Pool) -> Option<&'static StreamPools> {
        let gpu = self.gpu.get()?;
        let i = usize::try_from(pool.device()).ok()?;
        [gpu.devices.get(i)?, gpu.segments.get(i)?]
            .into_iter()
            .filter_map(|s| s.get().copied())
            .find(|g| g.holds(pool))
    }

    /// The device stream pools made so far (none before the device side is chosen): each
    /// device's side, then PyTorch's segments where they are apart.
    pub fn device_groups(&self) -> Vec<&'static StreamPools> {
        self.gpu.get().map_or_else(Vec::new, |g| {
            g.devices
                .iter()
                .chain(&g.segments)
                .filter_map(|s| s.get().copied())
                .collect()
        })
    }

    /// Every pool made so far, host side first.
    pub fn pools(&self) -> Vec<&'static Pool> {
        self.host
            .pools()
            .chain(self.device_groups().into_iter().flat_map(|g| g.pools()))
            .collect()
    }

    /// Fork: the lock that makes device pool sets (after the CUDA loader's, before any pool
    /// set's own).
    pub(crate) fn fork_lock_device_pools(&'static self, held: &mut Held) {
        held.push(lock(&self.device_pool_lock));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn segment_memory_is_set_by_name_and_auto_goes_back_to_the_configuration() {
        let choice = || SEGMENT_CHOICES[SEGMENTS_SET.load(Relaxed) as usize];
        set_segment_memory("device").unwrap();
        assert_eq!(choice(), Some(config::TorchSegments::Device));
        set_segment_memory(" SIDE").unwrap();
        assert_eq!(choice(), Some(config::TorchSegments::Side));
        assert!(set_segment_memory("managed").is_err());
        assert_eq!(
            choice(),
            Some(config::TorchSegments::Side),
            "a refused value changes nothing"
        );
        set_segment_memory("auto").unwrap();
        assert_eq!(choice(), None);
    }
}
