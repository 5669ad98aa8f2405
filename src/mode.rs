//! Modes and their selection: plain policy over the capabilities the CUDA module reports.
//! Nothing here calls the driver, so every rule is tested with injected capabilities.

use crate::error::{Error, Result};

/// Where memory comes from. The same mode governs every entry point (NumPy, CuPy, PyTorch).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum ump_mode {
    /// Not decided yet (no allocation and no `ump_init` so far).
    UMP_MODE_UNSET = 0,
    /// No GPU: plain aligned host memory everywhere.
    UMP_MODE_HOST = 1,
    /// System-allocated memory (malloc-backed), read by the GPU through HMM or ATS.
    UMP_MODE_SYSTEM = 2,
    /// CUDA managed memory (cuMemAllocManaged).
    UMP_MODE_MANAGED = 3,
    /// Host memory registered with cuMemHostRegister, mapped at the same address on the device.
    UMP_MODE_REGISTERED = 4,
    /// "UMP off": device memory for GPU libraries, plain aligned host memory for NumPy.
    UMP_MODE_DEVICE = 5,
}

/// The modes a machine can run (all but `UNSET`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    Host,
    System,
    Managed,
    Registered,
    Device,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Host,
        Mode::System,
        Mode::Managed,
        Mode::Registered,
        Mode::Device,
    ];
    /// The order `auto` tries.
    pub const AUTO_ORDER: [Mode; 4] = [Mode::System, Mode::Managed, Mode::Registered, Mode::Host];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Host => "host",
            Mode::System => "system",
            Mode::Managed => "managed",
            Mode::Registered => "registered",
            Mode::Device => "device",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL
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
        }
    }

    /// Whether memory handed to GPU libraries in this mode is also readable by the host.
    pub fn shares_memory(self) -> bool {
        matches!(self, Mode::System | Mode::Managed | Mode::Registered)
    }
}

/// What the user asked for: a mode, or `auto`.
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
            "unknown mode; expected one of auto, system, managed, registered, device, host"
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

/// The capabilities of one device that decide which modes work.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    pub ordinal: i32,
    pub name: String,
    /// CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: the GPU can read pageable (malloc) memory.
    pub pageable_memory_access: bool,
    /// ..._USES_HOST_PAGE_TABLES: that access goes through the host page tables (ATS).
    pub uses_host_page_tables: bool,
    /// CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS.
    pub concurrent_managed_access: bool,
    /// CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED.
    pub host_register_supported: bool,
    /// CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM.
    pub host_pointer_for_registered_mem: bool,
    pub total_memory: u64,
}

/// The whole machine as far as modes are concerned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineCaps {
    /// Why CUDA is not usable, if it is not (no libcuda, stub library, no device, old driver).
    pub cuda_unavailable: Option<String>,
    pub driver_version: i32,
    /// Whether the driver has the `_v2` prefetch and advise calls (driver >= 12.2).
    pub has_prefetch_v2: bool,
    pub devices: Vec<DeviceCaps>,
}

impl MachineCaps {
    /// A machine with no usable CUDA.
    pub fn no_cuda(why: impl Into<String>) -> Self {
        MachineCaps {
            cuda_unavailable: Some(why.into()),
            ..Default::default()
        }
    }

    /// Whether every device reads pageable (malloc) memory: HMM or ATS everywhere.
    pub fn pageable_everywhere(&self) -> bool {
        !self.devices.is_empty() && self.devices.iter().all(|d| d.pageable_memory_access)
    }

    fn has_gpu(&self) -> bool {
        self.cuda_unavailable.is_none() && !self.devices.is_empty()
    }

    /// Whether this machine can run `mode`; if not, the missing capability.
    pub fn supports(&self, mode: Mode) -> std::result::Result<(), String> {
        if mode == Mode::Host {
            return Ok(());
        }
        if !self.has_gpu() {
            let why = self
                .cuda_unavailable
                .clone()
                .unwrap_or_else(|| "no CUDA device".into());
            return Err(format!("no usable GPU ({why})"));
        }
        let need: (&str, fn(&DeviceCaps) -> bool) = match mode {
            Mode::System => ("pageable memory access (HMM or ATS)", |d| {
                d.pageable_memory_access
            }),
            Mode::Managed => ("concurrent managed access", |d| d.concurrent_managed_access),
            Mode::Registered => ("host-pointer use of registered memory", |d| {
                d.host_register_supported && d.host_pointer_for_registered_mem
            }),
            Mode::Device | Mode::Host => return Ok(()),
        };
        match self.devices.iter().find(|d| !need.1(d)) {
            None => Ok(()),
            Some(d) => Err(format!(
                "device {} ({}) lacks {}",
                d.ordinal, d.name, need.0
            )),
        }
    }

    /// Resolve a request to a mode, with the reason. A forced mode the machine cannot do is
    /// an error naming the missing capability and the mode to use instead.
    pub fn select(&self, req: ModeRequest) -> Result<(Mode, String)> {
        let auto = || {
            if !self.has_gpu() {
                let why = self
                    .cuda_unavailable
                    .clone()
                    .unwrap_or_else(|| "no CUDA device".into());
                return (Mode::Host, format!("auto: no usable GPU ({why}), so host"));
            }
            let mut skipped = Vec::new();
            for m in Mode::AUTO_ORDER {
                match self.supports(m) {
                    Ok(()) => {
                        let why = if skipped.is_empty() {
                            format!("auto: {} is supported", m.name())
                        } else {
                            format!("auto: {}; so {}", skipped.join("; "), m.name())
                        };
                        return (m, why);
                    }
                    Err(e) => skipped.push(format!("not {} ({e})", m.name())),
                }
            }
            unreachable!("host mode is always supported")
        };
        match req {
            ModeRequest::Auto => Ok(auto()),
            ModeRequest::Forced(m) => match self.supports(m) {
                Ok(()) => Ok((m, format!("forced by UMP_ALLOC_MODE={}", m.name()))),
                Err(missing) => {
                    let (alt, _) = auto();
                    Err(Error::unsupported(format!(
                        "mode '{}' is not available on this machine: {missing}; use UMP_ALLOC_MODE={} (or auto)",
                        m.name(),
                        alt.name()
                    )))
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(pageable: bool, ats: bool, managed: bool, reg: bool) -> DeviceCaps {
        DeviceCaps {
            ordinal: 0,
            name: "TestGPU".into(),
            pageable_memory_access: pageable,
            uses_host_page_tables: ats,
            concurrent_managed_access: managed,
            host_register_supported: reg,
            host_pointer_for_registered_mem: reg,
            total_memory: 1 << 30,
        }
    }

    fn machine(devs: Vec<DeviceCaps>) -> MachineCaps {
        MachineCaps {
            cuda_unavailable: None,
            driver_version: 13000,
            has_prefetch_v2: true,
            devices: devs,
        }
    }

    #[test]
    fn auto_order() {
        let h200 = machine(vec![dev(false, false, true, true)]);
        assert_eq!(h200.select(ModeRequest::Auto).unwrap().0, Mode::Managed);
        let gh = machine(vec![dev(true, true, true, true)]);
        assert_eq!(gh.select(ModeRequest::Auto).unwrap().0, Mode::System);
        let wsl = machine(vec![dev(false, false, false, true)]);
        assert_eq!(wsl.select(ModeRequest::Auto).unwrap().0, Mode::Registered);
        let odd = machine(vec![dev(false, false, false, false)]);
        assert_eq!(odd.select(ModeRequest::Auto).unwrap().0, Mode::Host);
        let none = MachineCaps::no_cuda("libcuda.so.1 not found");
        let (m, why) = none.select(ModeRequest::Auto).unwrap();
        assert_eq!(m, Mode::Host);
        assert!(why.contains("libcuda.so.1 not found"), "{why}");
    }

    #[test]
    fn every_device_must_support_the_mode() {
        let mut d1 = dev(true, true, true, true);
        d1.ordinal = 1;
        let mixed = machine(vec![dev(false, false, true, true), d1]);
        assert_eq!(mixed.select(ModeRequest::Auto).unwrap().0, Mode::Managed);
    }

    #[test]
    fn forcing_system_without_hmm_is_a_clear_error() {
        let h200 = machine(vec![dev(false, false, true, true)]);
        let e = h200.select(ModeRequest::Forced(Mode::System)).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_UNSUPPORTED);
        assert!(e.msg.contains("pageable memory access"), "{}", e.msg);
        assert!(e.msg.contains("UMP_ALLOC_MODE=managed"), "{}", e.msg);
    }

    #[test]
    fn forcing_gpu_modes_without_cuda_fails_but_host_works() {
        let none = MachineCaps::no_cuda("no libcuda");
        for m in [Mode::System, Mode::Managed, Mode::Registered, Mode::Device] {
            let e = none.select(ModeRequest::Forced(m)).unwrap_err();
            assert!(
                e.msg.contains("no usable GPU") && e.msg.contains("UMP_ALLOC_MODE=host"),
                "{}",
                e.msg
            );
        }
        assert_eq!(
            none.select(ModeRequest::Forced(Mode::Host)).unwrap().0,
            Mode::Host
        );
    }

    #[test]
    fn device_mode_needs_only_a_gpu() {
        let odd = machine(vec![dev(false, false, false, false)]);
        assert_eq!(
            odd.select(ModeRequest::Forced(Mode::Device)).unwrap().0,
            Mode::Device
        );
    }

    #[test]
    fn names_round_trip() {
        for m in Mode::ALL {
            assert_eq!(Mode::parse(m.name()), Some(m));
        }
        assert_eq!(ModeRequest::parse("AUTO"), Ok(ModeRequest::Auto));
        assert!(ModeRequest::parse("").is_err());
    }
}
