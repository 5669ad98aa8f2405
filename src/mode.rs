//! Modes and their selection: plain policy over the capabilities the CUDA module reports
//! (`prim::cuda::MachineCaps`, probed there; the selection is this file's).
//! Nothing here calls the driver, so every rule is tested with injected capabilities.
//!
//! ump-alloc serves two *sides*, each with its own kind of memory:
//! - the **host side**: NumPy and the C malloc family ([`HostSide`]);
//! - the **device side**: CuPy and PyTorch ([`DeviceSide`]).
//!
//! `auto` chooses per machine: with HMM or ATS on every device, system memory on both sides
//! (the GPU reads pageable memory); without (most x86 GPU servers), **pinned host memory**
//! mapped for every device on the host side, so that every copy runs at DMA speed and `fork()`
//! children can use the arrays, and **managed memory** on the device side, so that kernels run
//! at device speed and the host can view GPU arrays; with no GPU, plain host memory.
//! `UMP_ALLOC_MODE` names a preset pair ([`Mode`]); `UMP_ALLOC_HOST_SIDE` and
//! `UMP_ALLOC_DEVICE_SIDE` choose one side each.

use crate::backing::Kind;
use crate::error::{Error, Result};
use crate::prim::cuda::{DeviceCaps, MachineCaps};

/// The pair of sides in force, as a C value: a preset, or `UMP_MODE_CUSTOM`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ump_mode {
    /// Not decided yet (no allocation and no `ump_init` so far).
    UMP_MODE_UNSET = 0,
    /// No GPU: plain aligned host memory for NumPy; no GPU memory.
    UMP_MODE_HOST = 1,
    /// System-allocated memory (malloc-backed) on both sides, read by the GPU through HMM or ATS.
    UMP_MODE_SYSTEM = 2,
    /// CUDA managed memory (cuMemAllocManaged) on both sides.
    UMP_MODE_MANAGED = 3,
    /// Pinned host memory (cuMemHostRegister), mapped at the same address on every device, on
    /// both sides.
    UMP_MODE_REGISTERED = 4,
    /// "UMP off": plain aligned host memory for NumPy, device memory for GPU libraries.
    UMP_MODE_DEVICE = 5,
    /// Pinned host memory mapped for every device for NumPy, managed memory for GPU libraries
    /// (the `auto` choice on GPUs without HMM or ATS).
    UMP_MODE_PINNED = 6,
    /// Another pair, chosen with `UMP_ALLOC_HOST_SIDE` / `UMP_ALLOC_DEVICE_SIDE`.
    UMP_MODE_CUSTOM = 7,
}

/// Memory for the host side: NumPy and the C malloc family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostSide {
    /// Plain aligned host memory (copies for the GPU).
    Host,
    /// System memory that every GPU reads through HMM or ATS.
    System,
    /// Pinned host memory, mapped at the same address for every device.
    Pinned,
    /// Managed memory (not usable in a `fork()` child).
    Managed,
}

/// Memory for the device side: CuPy and PyTorch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceSide {
    /// No GPU memory (no usable GPU, or mode `host`).
    None,
    /// System memory, read by the GPU through HMM or ATS.
    System,
    /// Managed memory, preferred on the device.
    Managed,
    /// Pinned host memory mapped for the device (kernels reach it over the bus).
    Pinned,
    /// Plain device memory (the host cannot view it).
    Device,
}

impl HostSide {
    /// The kind of memory this host side is made of.
    pub fn kind(self) -> Kind {
        match self {
            HostSide::Host => Kind::UMP_KIND_HOST,
            HostSide::System => Kind::UMP_KIND_SYSTEM,
            HostSide::Pinned => Kind::UMP_KIND_REGISTERED,
            HostSide::Managed => Kind::UMP_KIND_MANAGED,
        }
    }

    pub const ALL: [HostSide; 4] = [
        HostSide::Host,
        HostSide::System,
        HostSide::Pinned,
        HostSide::Managed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            HostSide::Host => "host",
            HostSide::System => "system",
            HostSide::Pinned => "pinned",
            HostSide::Managed => "managed",
        }
    }

    pub fn parse(s: &str) -> Option<HostSide> {
        HostSide::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl DeviceSide {
    /// The kind of memory this device side is made of.
    pub fn kind(self) -> Kind {
        match self {
            DeviceSide::None => Kind::UMP_KIND_UNKNOWN,
            DeviceSide::System => Kind::UMP_KIND_SYSTEM,
            DeviceSide::Managed => Kind::UMP_KIND_MANAGED,
            DeviceSide::Pinned => Kind::UMP_KIND_REGISTERED,
            DeviceSide::Device => Kind::UMP_KIND_DEVICE,
        }
    }

    pub const ALL: [DeviceSide; 4] = [
        DeviceSide::System,
        DeviceSide::Managed,
        DeviceSide::Pinned,
        DeviceSide::Device,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DeviceSide::None => "none",
            DeviceSide::System => "system",
            DeviceSide::Managed => "managed",
            DeviceSide::Pinned => "pinned",
            DeviceSide::Device => "device",
        }
    }

    /// A side a user may ask for (`none` is only ever the result of having no GPU).
    pub fn parse(s: &str) -> Option<DeviceSide> {
        DeviceSide::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }
}

/// The kinds of memory of both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sides {
    pub host: HostSide,
    pub device: DeviceSide,
}

/// A preset pair of sides (`UMP_ALLOC_MODE`), or another pair (`Custom`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Host,
    System,
    Managed,
    Registered,
    Device,
    Pinned,
    Custom,
}

impl Mode {
    /// The presets a user may name.
    pub const PRESETS: [Mode; 6] = [
        Mode::Host,
        Mode::System,
        Mode::Managed,
        Mode::Registered,
        Mode::Device,
        Mode::Pinned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Host => "host",
            Mode::System => "system",
            Mode::Managed => "managed",
            Mode::Registered => "registered",
            Mode::Device => "device",
            Mode::Pinned => "pinned",
            Mode::Custom => "custom",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::PRESETS
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(s.trim()))
    }

    pub fn to_c(self) -> ump_mode {
        match self {
            Mode::Host => ump_mode::UMP_MODE_HOST,
            Mode::System => ump_mode::UMP_MODE_SYSTEM,
            Mode::Managed => ump_mode::UMP_MODE_MANAGED,
            Mode::Registered => ump_mode::UMP_MODE_REGISTERED,
            Mode::Device => ump_mode::UMP_MODE_DEVICE,
            Mode::Pinned => ump_mode::UMP_MODE_PINNED,
            Mode::Custom => ump_mode::UMP_MODE_CUSTOM,
        }
    }

    /// The sides of a preset (`Custom` has none of its own).
    pub fn sides(self) -> Option<Sides> {
        let (host, device) = match self {
            Mode::Host => (HostSide::Host, DeviceSide::None),
            Mode::System => (HostSide::System, DeviceSide::System),
            Mode::Managed => (HostSide::Managed, DeviceSide::Managed),
            Mode::Registered => (HostSide::Pinned, DeviceSide::Pinned),
            Mode::Device => (HostSide::Host, DeviceSide::Device),
            Mode::Pinned => (HostSide::Pinned, DeviceSide::Managed),
            Mode::Custom => return None,
        };
        Some(Sides { host, device })
    }

    /// The preset with these sides, or `Custom`.
    pub fn of(sides: Sides) -> Mode {
        Mode::PRESETS
            .into_iter()
            .find(|m| m.sides() == Some(sides))
            .unwrap_or(Mode::Custom)
    }
}

/// What the user asked for: a preset, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeRequest {
    Auto,
    Forced(Mode),
}

impl ModeRequest {
    pub fn parse(s: &str) -> std::result::Result<ModeRequest, String> {
        if s.trim().eq_ignore_ascii_case("auto") {
            return Ok(ModeRequest::Auto);
        }
        Mode::parse(s).map(ModeRequest::Forced).ok_or_else(|| {
            "unknown mode; expected one of auto, pinned, system, managed, registered, device, host"
                .to_string()
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            ModeRequest::Auto => "auto",
            ModeRequest::Forced(m) => m.name(),
        }
    }
}

/// What the user asked for one side: `auto` (the mode's), or a kind of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SideRequest<T> {
    Auto,
    Forced(T),
}

/// The sides chosen, with the reason for each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub mode: Mode,
    pub sides: Sides,
    pub host_reason: String,
    pub device_reason: String,
}

impl Selection {
    /// Both reasons in one line.
    pub fn reason(&self) -> String {
        format!(
            "host side {}: {}; device side {}: {}",
            self.sides.host.name(),
            self.host_reason,
            self.sides.device.name(),
            self.device_reason
        )
    }
}

type Need = (&'static str, fn(&DeviceCaps) -> bool);

const PAGEABLE: Need = ("pageable memory access (HMM or ATS)", |d| {
    d.pageable_memory_access
});
const MANAGED: Need = ("concurrent managed access", |d| d.concurrent_managed_access);
const REGISTER: Need = ("host-pointer use of registered memory", |d| {
    d.host_register_supported && d.host_pointer_for_registered_mem
});

impl MachineCaps {
    fn has_gpu(&self) -> bool {
        self.cuda_unavailable.is_none() && !self.devices.is_empty()
    }

    fn no_gpu(&self) -> String {
        let why = self
            .cuda_unavailable
            .clone()
            .unwrap_or_else(|| "no CUDA device".into());
        format!("no usable GPU ({why})")
    }

    /// Whether every device has `need`; if not, the first device that lacks it.
    fn every_device(&self, need: Need) -> std::result::Result<(), String> {
        if !self.has_gpu() {
            return Err(self.no_gpu());
        }
        match self.devices.iter().find(|d| !need.1(d)) {
            None => Ok(()),
            Some(d) => Err(format!(
                "device {} ({}) lacks {}",
                d.ordinal, d.name, need.0
            )),
        }
    }

    /// Whether this machine can give the host side `side`; if not, what is missing.
    pub fn supports_host(&self, side: HostSide) -> std::result::Result<(), String> {
        match side {
            HostSide::Host => Ok(()),
            HostSide::System => self.every_device(PAGEABLE),
            HostSide::Pinned => self.every_device(REGISTER),
            HostSide::Managed => self.every_device(MANAGED),
        }
    }

    /// Whether this machine can give the device side `side`; if not, what is missing.
    pub fn supports_device(&self, side: DeviceSide) -> std::result::Result<(), String> {
        match side {
            DeviceSide::None => Ok(()),
            DeviceSide::System => self.every_device(PAGEABLE),
            DeviceSide::Managed => self.every_device(MANAGED),
            DeviceSide::Pinned => self.every_device(REGISTER),
            DeviceSide::Device => {
                if self.has_gpu() {
                    Ok(())
                } else {
                    Err(self.no_gpu())
                }
            }
        }
    }

    /// Whether this machine can run preset `mode`; if not, the missing capability.
    pub fn supports(&self, mode: Mode) -> std::result::Result<(), String> {
        let Some(s) = mode.sides() else {
            return Ok(());
        };
        self.supports_host(s.host)?;
        self.supports_device(s.device)
    }

    /// The sides `auto` chooses, with the reason for each.
    fn auto_sides(&self) -> (Sides, String, String) {
        if !self.has_gpu() {
            let why = format!("auto: {}", self.no_gpu());
            return (
                Sides {
                    host: HostSide::Host,
                    device: DeviceSide::None,
                },
                why.clone(),
                why,
            );
        }
        if self.pageable_everywhere() {
            let why = "auto: every device reads pageable memory (HMM or ATS)".to_string();
            return (
                Sides {
                    host: HostSide::System,
                    device: DeviceSide::System,
                },
                why.clone(),
                why,
            );
        }
        let no_hmm = self
            .every_device(PAGEABLE)
            .err()
            .unwrap_or_else(|| "no HMM or ATS".into());
        let (host, host_reason) = match self.supports_host(HostSide::Pinned) {
            Ok(()) => (
                HostSide::Pinned,
                format!(
                    "auto: {no_hmm}; pinned host memory mapped for every device: DMA-speed copies, \
                     GPU access without a copy, and usable in fork() children"
                ),
            ),
            Err(e) => (
                HostSide::Host,
                format!("auto: {no_hmm}, and {e}; plain host memory (the GPU gets copies)"),
            ),
        };
        let (device, device_reason) = match self.every_device(MANAGED) {
            Ok(()) => (
                DeviceSide::Managed,
                "auto: concurrent managed access on every device; managed memory: kernels at \
                 device speed once migrated, and the host can view GPU arrays"
                    .to_string(),
            ),
            Err(e) => match self.supports_device(DeviceSide::Pinned) {
                Ok(()) => (
                    DeviceSide::Pinned,
                    format!("auto: {e}; pinned host memory mapped for the device"),
                ),
                Err(e2) => (
                    DeviceSide::Device,
                    format!("auto: {e}, and {e2}; plain device memory"),
                ),
            },
        };
        (Sides { host, device }, host_reason, device_reason)
    }

    /// Resolve a request to sides, with the reason for each. A forced preset or side the
    /// machine cannot do is an error naming the missing capability and what to use instead,
    /// in the terms of the environment (`UMP_ALLOC_MODE=host`): the request `init` and
    /// `ump_capabilities` resolve.
    pub fn select_sides(
        &self,
        mode: ModeRequest,
        host: SideRequest<HostSide>,
        device: SideRequest<DeviceSide>,
    ) -> Result<Selection> {
        self.resolve(mode, host, device, |m| {
            format!("UMP_ALLOC_MODE={m} (or auto)")
        })
    }

    /// [`select_sides`](Self::select_sides) for a mode requested through a call
    /// (`ump_set_mode`, Python's `enable(mode=...)`), with both sides from the mode: an
    /// unavailable mode names the fix as that call's argument (`mode="host"`), not as a
    /// variable the caller did not set.
    pub fn select(&self, req: ModeRequest) -> Result<(Mode, String)> {
        let s = self.resolve(req, SideRequest::Auto, SideRequest::Auto, |m| {
            format!("mode=\"{m}\" (or mode=\"auto\")")
        })?;
        Ok((s.mode, s.reason()))
    }

    /// The resolution behind both: `mode_fix(name)` spells "use the mode `name`" for the
    /// message when the requested mode is not available.
    fn resolve(
        &self,
        mode: ModeRequest,
        host: SideRequest<HostSide>,
        device: SideRequest<DeviceSide>,
        mode_fix: impl Fn(&str) -> String,
    ) -> Result<Selection> {
        let (auto, auto_host, auto_device) = self.auto_sides();
        let (mut sides, mut host_reason, mut device_reason) = match mode {
            ModeRequest::Auto => (auto, auto_host, auto_device),
            ModeRequest::Forced(m) => {
                if let Err(missing) = self.supports(m) {
                    return Err(Error::unsupported(format!(
                        "mode '{}' is not available on this machine: {missing}; use {}",
                        m.name(),
                        mode_fix(Mode::of(auto).name())
                    )));
                }
                let why = format!("UMP_ALLOC_MODE={}", m.name());
                (m.sides().expect("a preset"), why.clone(), why)
            }
        };
        if let SideRequest::Forced(h) = host {
            if let Err(missing) = self.supports_host(h) {
                return Err(Error::unsupported(format!(
                    "host side '{}' is not available on this machine: {missing}; use \
                     UMP_ALLOC_HOST_SIDE={} (or auto)",
                    h.name(),
                    auto.host.name()
                )));
            }
            sides.host = h;
            host_reason = format!("UMP_ALLOC_HOST_SIDE={}", h.name());
        }
        if let SideRequest::Forced(d) = device {
            if let Err(missing) = self.supports_device(d) {
                let fix = if auto.device == DeviceSide::None {
                    "unset UMP_ALLOC_DEVICE_SIDE (or set it to auto): without a usable GPU there \
                     is no device side"
                        .to_string()
                } else {
                    format!("use UMP_ALLOC_DEVICE_SIDE={} (or auto)", auto.device.name())
                };
                return Err(Error::unsupported(format!(
                    "device side '{}' is not available on this machine: {missing}; {fix}",
                    d.name()
                )));
            }
            sides.device = d;
            device_reason = format!("UMP_ALLOC_DEVICE_SIDE={}", d.name());
        }
        Ok(Selection {
            mode: Mode::of(sides),
            sides,
            host_reason,
            device_reason,
        })
    }
}

#[cfg(test)]
mod tests;
