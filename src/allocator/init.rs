//! The process-wide state and its initialisation: the configuration from the environment and
//! the machine's capabilities, each read once; the host side chosen without asking the machine
//! where the rest can wait; `init`, which fixes the configuration and makes the host side; and
//! `check`, the verdict `init` would give.

use super::overrides::with_overrides;
use super::state::{Allocator, Gpu};
use crate::config::{self, Config};
use crate::error::Result;
use crate::host::HostPools;
use crate::mode::{HostSide, Mode, ModeRequest};
use crate::prim::cuda::{self, MachineCaps};
use crate::prim::fork::lock;
use crate::prim::os;
use std::sync::{Mutex, OnceLock};

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

static ENV: OnceLock<Result<Config>> = OnceLock::new();
static CAPS: OnceLock<MachineCaps> = OnceLock::new();
pub(super) static STATE: OnceLock<Allocator> = OnceLock::new();
pub(super) static INIT: Mutex<()> = Mutex::new(());

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
