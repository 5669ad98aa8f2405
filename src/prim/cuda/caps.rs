//! The capabilities that decide which modes work (the machine's and each device's), and the
//! probe that reads them from the driver. Which mode they lead to is `mode`'s policy.

use super::libcuda::{CUDA_SUCCESS, Driver, driver};
use super::vmm;
use cudarc::driver::sys::{CUdevice, CUdevice_attribute};
use std::ffi::{c_char, c_int};

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
    /// CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, and the driver has every
    /// `cuMem{AddressReserve,Create,Map,SetAccess,...}` call: device pools reserve address space
    /// and map physical memory into it as they grow (`backing::vmm`).
    pub virtual_memory: bool,
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
}

fn device_attr(d: &Driver, dev: CUdevice, attr: CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: `v` is a valid out-pointer; an unknown attribute only returns an error code.
    let rc = unsafe { (d.cuDeviceGetAttribute)(&mut v, attr, dev) };
    if rc == CUDA_SUCCESS { v } else { 0 }
}

/// Probe the machine: driver version, and per device the capabilities that decide modes.
pub fn probe() -> MachineCaps {
    let d = match driver() {
        Ok(d) => d,
        Err(e) => return MachineCaps::no_cuda(e.msg.trim_start_matches("CUDA is not available: ")),
    };
    let mut version = 0;
    // SAFETY: valid out-pointer.
    unsafe { (d.cuDriverGetVersion)(&mut version) };
    let mut count = 0;
    // SAFETY: valid out-pointer.
    if unsafe { (d.cuDeviceGetCount)(&mut count) } != CUDA_SUCCESS || count <= 0 {
        return MachineCaps::no_cuda("the CUDA driver reports no device");
    }
    let mut devices = Vec::new();
    for i in 0..count {
        let mut dev: CUdevice = 0;
        // SAFETY: valid out-pointer, ordinal in range.
        if unsafe { (d.cuDeviceGet)(&mut dev, i) } != CUDA_SUCCESS {
            continue;
        }
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes and the driver writes at most that, NUL included.
        unsafe { (d.cuDeviceGetName)(name.as_mut_ptr(), name.len() as c_int, dev) };
        // SAFETY: NUL-terminated by the driver (or all zero).
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut total = 0usize;
        // SAFETY: valid out-pointer.
        unsafe { (d.cuDeviceTotalMem_v2)(&mut total, dev) };
        use CUdevice_attribute as A;
        devices.push(DeviceCaps {
            ordinal: i,
            name,
            pageable_memory_access: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
            ) != 0,
            uses_host_page_tables: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
            ) != 0,
            concurrent_managed_access: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
            ) != 0,
            host_register_supported: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
            ) != 0,
            host_pointer_for_registered_mem: device_attr(
                d,
                dev,
                A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
            ) != 0,
            virtual_memory: vmm::supported(d)
                && device_attr(
                    d,
                    dev,
                    A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                ) != 0,
            total_memory: total as u64,
        });
    }
    MachineCaps {
        cuda_unavailable: None,
        driver_version: version,
        has_prefetch_v2: d.cuMemPrefetchAsync_v2.is_some() && d.cuMemAdvise_v2.is_some(),
        devices,
    }
}
