//! The allocator: one process-wide state that fixes the mode and the alignment at the first
//! allocation and composes a pool over the right backing for the host side (NumPy) and for
//! each device (CuPy, PyTorch). Safe Rust; the C contract sits in `ffi`, the driver in `prim`.

use crate::backing::{
    Backing, DeviceBacking, HostBacking, Kind, ManagedBacking, RegisteredBacking, Space, VmmBacking,
};
use crate::config::{self, Config};
use crate::error::{Error, Result, Status};
use crate::host::HostPools;
use crate::mode::{DeviceSide, HostSide, Mode, ModeRequest, Selection};
use crate::pool::{self, BlockInfo, Pool, PoolStats};
use crate::prim::cuda::{self, MachineCaps};
use crate::prim::fork::{Held, lock};
use crate::prim::os;
use crate::stream::StreamPools;
use std::sync::{Mutex, OnceLock};

mod device;
mod malloc;

pub use device::{
    device_free, device_malloc, device_memory_info, device_record_stream, device_trim,
    segment_free, segment_malloc, set_device_fraction,
};
pub use malloc::{
    block_alignment, calloc, free, free_cached, malloc, malloc_cached, realloc, realloc_cached,
};

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

/// The host side a configuration gets without asking the machine, if the rest can wait: a
/// plain host side with the device side left to `auto` (`UMP_ALLOC_HOST_SIDE=host`, or mode
/// `host`); or, with every side left to `auto` and `UMP_ALLOC_PIN=lazy` on a machine with
/// NVIDIA GPU device nodes, the pinned host side, whose memory is pinned only once the process
/// uses a GPU: the driver is loaded then (`cuInit` alone took about 0.5 s on the lent H100),
/// not by a process that only uses NumPy. Anything else needs the capabilities at once (to
/// choose, or to refuse a side the machine cannot do when the allocator is enabled).
fn host_side_without_caps(config: &Config) -> Option<HostSide> {
    use crate::mode::SideRequest::{Auto, Forced};
    let plain = matches!(
        (config.mode, config.host_side),
        (ModeRequest::Auto, Forced(HostSide::Host))
            | (
                ModeRequest::Forced(Mode::Host),
                Auto | Forced(HostSide::Host)
            )
    );
    if plain && config.device_side == Auto {
        return Some(HostSide::Host);
    }
    let all_auto =
        (config.mode, config.host_side, config.device_side) == (ModeRequest::Auto, Auto, Auto);
    let lazy = matches!(config.pin, config::Pin::Lazy | config::Pin::LazyAll);
    (all_auto && lazy && !config.no_cuda && cuda::device_nodes_present())
        .then_some(HostSide::Pinned)
}

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

/// Settings made through the API before initialisation; they override the environment.
#[derive(Default)]
struct Overrides {
    mode: Option<ModeRequest>,
    alignment: Option<usize>,
    /// `Some(None)`: no limit, whatever the environment says.
    limit: Option<Option<usize>>,
}

static OVERRIDES: Mutex<Overrides> = Mutex::new(Overrides {
    mode: None,
    alignment: None,
    limit: None,
});
static ENV: OnceLock<Result<Config>> = OnceLock::new();
static CAPS: OnceLock<MachineCaps> = OnceLock::new();
static STATE: OnceLock<Allocator> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

/// The configuration from the environment, read and validated once (under `INIT`, so that
/// no initialisation is half done at a fork; never call it with `INIT` held).
pub fn env_config() -> Result<Config> {
    if let Some(c) = ENV.get() {
        return c.clone();
    }
    let _g = lock(&INIT);
    ENV.get_or_init(Config::from_env).clone()
}

/// The machine's capabilities, probed once (under `INIT`, like [`env_config`]).
pub fn caps() -> &'static MachineCaps {
    if let Some(c) = CAPS.get() {
        return c;
    }
    let _g = lock(&INIT);
    CAPS.get_or_init(cuda::probe)
}

/// The configuration [`init`] would use now: the environment's, with the settings made through
/// the API (`set_mode` and the like) in force. Once initialised, the one in force.
pub fn config() -> Result<Config> {
    match STATE.get() {
        Some(a) => Ok(a.config.clone()),
        None => env_config().map(with_overrides),
    }
}

/// The allocator if it is initialised.
pub fn get() -> Option<&'static Allocator> {
    STATE.get()
}

/// The allocator, initialising it on first use. Initialisation failures are not cached: a
/// later call (say after `set_mode`) tries again.
#[inline]
pub fn instance() -> Result<&'static Allocator> {
    match STATE.get() {
        Some(a) => Ok(a),
        None => init(),
    }
}

/// Initialise now: read the configuration, select the mode, make the host pool.
pub fn init() -> Result<&'static Allocator> {
    if let Some(a) = STATE.get() {
        return Ok(a);
    }
    // Both take INIT themselves: before it is held here.
    let config = env_config();
    let caps = match &config {
        Ok(c) if host_side_without_caps(&with_overrides(c.clone())).is_some() => None,
        _ => Some(caps()),
    };
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        return Ok(a);
    }
    let config = with_overrides(config?);
    let gpu = OnceLock::new();
    let early = host_side_without_caps(&config);
    let provisional = early == Some(HostSide::Pinned);
    let side = match early {
        Some(side) => side,
        None => {
            // Probed above, unless an override changed the request meanwhile (INIT is held
            // here: probe directly, as `caps` does under it).
            let caps = caps
                .unwrap_or_else(|| CAPS.get_or_init(cuda::probe))
                .clone();
            let selection = caps.select_sides(config.mode, config.host_side, config.device_side)?;
            let side = selection.sides.host;
            let _ = gpu.set(Gpu::new(caps, selection));
            side
        }
    };
    crate::backing::set_pinned_cap(config.pinned_limit.bytes(os::memory_available()));
    let host = HostPools::new(side, &config);
    let a = Allocator {
        alignment: config.alignment,
        config,
        host,
        gpu,
        provisional,
        device_pool_lock: Mutex::new(()),
    };
    Ok(STATE.get_or_init(|| a))
}

/// `config` with the settings made through the API (`set_mode` and the like) in force.
fn with_overrides(mut config: Config) -> Config {
    let o = lock(&OVERRIDES);
    if let Some(m) = o.mode {
        config.mode = m;
    }
    if let Some(a) = o.alignment {
        config.alignment = a;
    }
    if let Some(l) = o.limit {
        config.limit = l;
    }
    config
}

/// The verdict [`init`] would give on the configuration, without initialising: the
/// environment's values, then the mode and sides they ask for on this machine (a plain host
/// side with the device side left to `auto` needs no probe, as in `init`). `Ok` once
/// initialised.
pub fn check() -> Result<()> {
    if STATE.get().is_some() {
        return Ok(());
    }
    let config = config()?;
    if host_side_without_caps(&config).is_some() {
        return Ok(());
    }
    caps()
        .select_sides(config.mode, config.host_side, config.device_side)
        .map(|_| ())
}

/// The sides in force with the reason for each, or, before initialisation, those the
/// configuration would select on this machine, API settings included, as [`check`] judges it
/// (nothing is fixed; the configuration's error when it is invalid or asks for what the
/// machine cannot do).
pub fn selection() -> Result<Selection> {
    match get() {
        Some(a) => Ok(a.gpu().selection.clone()),
        None => {
            config().and_then(|cfg| caps().select_sides(cfg.mode, cfg.host_side, cfg.device_side))
        }
    }
}

/// What `fork()` does with the host side's memory (`host::fork_rule`): the rule in force, or,
/// before initialisation, the one the configuration would give on this machine (None when it
/// gives none).
pub fn fork_rule() -> Option<(bool, String)> {
    if let Some(a) = get() {
        return Some(a.host().fork_rule());
    }
    let side = selection().ok()?.sides.host;
    let share = config().ok()?.pinned_fork == config::PinnedFork::Share;
    Some(crate::host::fork_rule(
        side,
        &RegisteredBacking::host_share(share),
    ))
}

/// Request a mode before the first allocation. Afterwards only the mode in force is accepted.
pub fn set_mode(req: ModeRequest) -> Result<()> {
    // Mode `host` needs no GPU: it is accepted without asking the machine.
    let caps = (req != ModeRequest::Forced(Mode::Host)).then(caps);
    if let Some(a) = get()
        && req != ModeRequest::Auto
    {
        // Resolved before INIT is held (it takes INIT itself).
        a.gpu();
    }
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        let mode = a.gpu.get().map(|g| g.mode);
        return match req {
            ModeRequest::Forced(m) if Some(m) == mode => Ok(()),
            ModeRequest::Auto if a.config.mode == ModeRequest::Auto => Ok(()),
            _ => Err(Error::new(
                Status::UMP_ERR_LOCKED,
                format!(
                    "the mode is already '{}' (fixed at the first allocation); it cannot change to '{}'",
                    mode.map_or("unset", Mode::name),
                    req.name()
                ),
            )),
        };
    }
    // Refuse a mode this machine cannot do now, not at the first allocation.
    if let Some(caps) = caps {
        caps.select(req)?;
    }
    lock(&OVERRIDES).mode = Some(req);
    Ok(())
}

/// Request an alignment before the first allocation. Afterwards only the one in force is
/// accepted.
pub fn set_alignment(n: usize) -> Result<()> {
    let n = config::check_alignment(n).map_err(|e| Error::config(format!("alignment {e}")))?;
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        if a.alignment == n {
            return Ok(());
        }
        return Err(Error::new(
            Status::UMP_ERR_LOCKED,
            format!(
                "the alignment is already {} (fixed at the first allocation); it cannot change to {n}",
                a.alignment
            ),
        ));
    }
    lock(&OVERRIDES).alignment = Some(n);
    Ok(())
}

/// Request a limit (`None`: no limit) before the first allocation. Afterwards only the one in
/// force is accepted.
pub fn set_limit(limit: Option<usize>) -> Result<()> {
    let _g = lock(&INIT);
    if let Some(a) = STATE.get() {
        if a.config.limit == limit {
            return Ok(());
        }
        let show = |l: Option<usize>| l.map_or("none".to_string(), |n| format!("{n} bytes"));
        return Err(Error::new(
            Status::UMP_ERR_LOCKED,
            format!(
                "the limit is already {} (fixed at the first allocation); it cannot change to {}",
                show(a.config.limit),
                show(limit)
            ),
        ));
    }
    lock(&OVERRIDES).limit = Some(limit);
    Ok(())
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

    /// The capabilities and the sides, probing the machine now if that was left for later.
    pub fn gpu(&self) -> &Gpu {
        if let Some(g) = self.gpu.get() {
            return g;
        }
        // Probed before INIT is held (it takes INIT itself); made under INIT, so that no
        // fork finds it half made.
        let caps = caps().clone();
        let _g = lock(&INIT);
        self.gpu.get_or_init(|| {
            let c = &self.config;
            let mut selection = caps
                .select_sides(c.mode, c.host_side, c.device_side)
                .unwrap_or_else(|e| Selection {
                    mode: Mode::Host,
                    sides: crate::mode::Sides {
                        host: HostSide::Host,
                        device: DeviceSide::None,
                    },
                    host_reason: "plain host memory".into(),
                    device_reason: e.msg,
                });
            let host = self.host.side();
            if self.provisional && selection.sides.host != host {
                // The host side was made before the machine was asked: it stays, as memory
                // that is never pinned (the machine does not need it, or does not allow it).
                crate::backing::never_pin();
                selection.host_reason = format!(
                    "made as pinned host memory before the GPU was asked (UMP_ALLOC_PIN=lazy); \
                     this machine would take {} ({}), so it is never pinned: plain host memory \
                     (UMP_ALLOC_PIN=eager chooses at start)",
                    selection.sides.host.name(),
                    selection.host_reason
                );
                selection.sides.host = host;
                selection.mode = Mode::of(selection.sides);
            }
            Gpu::new(caps, selection)
        })
    }

    /// The mode without asking the machine: the one in force once the machine was asked, else
    /// the one the sides chosen at start make (`host`, or `pinned` for a pinned host side made
    /// before the GPU was asked), else None.
    pub fn mode_known(&self) -> Option<Mode> {
        match self.gpu.get() {
            Some(g) => Some(g.mode),
            None if self.config.mode == ModeRequest::Forced(Mode::Host) => Some(Mode::Host),
            None if self.provisional => Some(Mode::Pinned),
            None => None,
        }
    }

    /// The capabilities and the sides if they were made (see [`gpu`](Self::gpu)).
    pub fn gpu_if_chosen(&self) -> Option<&Gpu> {
        self.gpu.get()
    }

    /// The preset the sides make up (or `Custom`): [`mode_known`](Self::mode_known) where that
    /// answers (so a pinned host side waiting for a GPU says `pinned` and starts no driver),
    /// else it probes the machine (see [`gpu`](Self::gpu)).
    pub fn mode(&self) -> Mode {
        self.mode_known().unwrap_or_else(|| self.gpu().mode)
    }

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
        let slot = usize::try_from(device)
            .ok()
            .and_then(|i| slots.get(i))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "no CUDA device {device} (this machine has {})",
                    slots.len()
                ))
            })?;
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

    /// Whether device code can reach memory of `kind` on this machine.
    #[inline]
    pub fn device_accessible(&self, kind: Kind) -> bool {
        match kind {
            Kind::UMP_KIND_MANAGED | Kind::UMP_KIND_REGISTERED | Kind::UMP_KIND_DEVICE => true,
            // Host memory: where the machine has HMM or ATS.
            Kind::UMP_KIND_HOST | Kind::UMP_KIND_SYSTEM | Kind::UMP_KIND_FOREIGN_HOST => {
                match self.gpu.get() {
                    Some(g) => g.hmm,
                    // The plain fallback of a pinned host side that waits for the first use
                    // of a GPU: host memory only, for now, as its pinned chunks are (asking
                    // the machine would start the driver, after which no fork child could
                    // use CUDA).
                    None if self.provisional && kind == Kind::UMP_KIND_HOST => false,
                    None => self.gpu().hmm,
                }
            }
            Kind::UMP_KIND_FOREIGN_CUDA | Kind::UMP_KIND_UNKNOWN => false,
        }
    }
}

// ---- blocks of either side -----------------------------------------------------------------

/// The process uses GPU `device` (where known) through ump-alloc, by a way no device-side
/// allocation shows (a transfer call, a view it hands a GPU): the machine is asked (once) and
/// NumPy's memory pinned where it waits for that (`UMP_ALLOC_PIN=lazy`).
pub fn use_gpu(device: Option<i32>) {
    if let Some(a) = get() {
        a.gpu();
    }
    crate::backing::pin_host_side(device);
}

/// Refuse `device` unless it names a GPU of this machine (on a machine without one, device 0
/// stands for the GPU a plan is made for).
pub fn check_device(device: i32) -> Result<()> {
    let count = caps().devices.len();
    if usize::try_from(device).is_ok_and(|d| d < count.max(1)) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "no CUDA device {device} (this machine has {count})"
    )))
}

/// Whether `ptr` lies in memory this library's pools hold (a live block or not). Memory from
/// any other allocator never does: the registry covers only chunks this library mapped, and
/// forgets a chunk before it goes back to the OS.
#[inline]
pub fn owns(ptr: usize) -> bool {
    pool::entry_at(ptr).is_some()
}

/// The live block starting exactly at `ptr`, or the error that explains why not.
pub fn block_at(ptr: usize) -> Result<BlockInfo> {
    block_of(pool::entry_at(ptr), ptr).map(|(_, info)| info)
}

/// [`block_at`] given the registry's entry for `ptr` (so that a caller that goes on to free
/// the block looks it up once).
fn block_of(entry: Option<pool::Entry>, ptr: usize) -> Result<(pool::Entry, BlockInfo)> {
    let Some(entry) = entry else {
        return Err(Error::not_ours(format!(
            "{ptr:#x} was not allocated by ump-alloc"
        )));
    };
    match entry.lookup(ptr) {
        Some(info) if info.base == ptr => Ok((entry, info)),
        Some(info) => Err(Error::not_ours(format!(
            "{ptr:#x} points inside the block at {:#x}, not at its start",
            info.base
        ))),
        None => Err(Error::double_free(format!(
            "{ptr:#x} is not a live block (already freed?)"
        ))),
    }
}

/// The error for a second free of a block whose first free waits for other streams.
#[cold]
fn deferred_twice(ptr: usize) -> Error {
    Error::double_free(format!(
        "double free of {ptr:#x} (freed already, waiting for the streams it was recorded on)"
    ))
}

/// Give cached memory of every pool back to the OS and the driver, whichever thread cached
/// it. Returns the bytes given back.
pub fn trim() -> usize {
    get().map_or(0, |a| {
        a.host.trim() + a.device_groups().iter().map(|g| g.trim()).sum::<usize>()
    })
}

/// Fork: the initialisation lock and the settings made before it (first in the order, see
/// `crate::fork`).
pub(crate) fn fork_lock_settings(held: &mut Held) {
    held.push(lock(&INIT));
    held.push(lock(&OVERRIDES));
}

/// Set errno to ENOMEM (the malloc family's way of saying why NULL came back).
pub fn set_enomem() {
    os::set_errno(libc::ENOMEM);
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
