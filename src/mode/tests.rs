//! Tests of `src/mode.rs`.

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
        virtual_memory: true,
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
    let s = h200
        .select_sides(ModeRequest::Auto, SideRequest::Auto, SideRequest::Auto)
        .unwrap();
    assert_eq!(s.mode, Mode::Pinned);
    assert_eq!(
        (s.sides.host, s.sides.device),
        (HostSide::Pinned, DeviceSide::Managed)
    );
    assert!(
        s.host_reason.contains("pageable memory access"),
        "{}",
        s.host_reason
    );
    let gh = machine(vec![dev(true, true, true, true)]);
    assert_eq!(gh.select(ModeRequest::Auto).unwrap().0, Mode::System);
    let wsl = machine(vec![dev(false, false, false, true)]);
    assert_eq!(wsl.select(ModeRequest::Auto).unwrap().0, Mode::Registered);
    let odd = machine(vec![dev(false, false, false, false)]);
    let s = odd
        .select_sides(ModeRequest::Auto, SideRequest::Auto, SideRequest::Auto)
        .unwrap();
    assert_eq!(
        (s.sides.host, s.sides.device),
        (HostSide::Host, DeviceSide::Device)
    );
    assert_eq!(s.mode, Mode::Device);
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
    assert_eq!(mixed.select(ModeRequest::Auto).unwrap().0, Mode::Pinned);
}

#[test]
fn forcing_system_without_hmm_is_a_clear_error() {
    let h200 = machine(vec![dev(false, false, true, true)]);
    let e = h200
        .select_sides(
            ModeRequest::Forced(Mode::System),
            SideRequest::Auto,
            SideRequest::Auto,
        )
        .unwrap_err();
    assert_eq!(e.status, crate::error::Status::UMP_ERR_UNSUPPORTED);
    assert!(e.msg.contains("pageable memory access"), "{}", e.msg);
    assert!(e.msg.contains("UMP_ALLOC_MODE=pinned"), "{}", e.msg);
    // Asked through a call (ump_set_mode, enable(mode=...)): the fix is that call's
    // argument, not a variable the caller never set.
    let e = h200.select(ModeRequest::Forced(Mode::System)).unwrap_err();
    assert_eq!(e.status, crate::error::Status::UMP_ERR_UNSUPPORTED);
    assert!(e.msg.contains("pageable memory access"), "{}", e.msg);
    assert!(
        e.msg.contains("use mode=\"pinned\" (or mode=\"auto\")"),
        "{}",
        e.msg
    );
    assert!(!e.msg.contains("UMP_ALLOC_MODE"), "{}", e.msg);
}

#[test]
fn forcing_gpu_modes_without_cuda_fails_but_host_works() {
    let none = MachineCaps::no_cuda("no libcuda");
    for m in [
        Mode::System,
        Mode::Managed,
        Mode::Registered,
        Mode::Device,
        Mode::Pinned,
    ] {
        let e = none
            .select_sides(ModeRequest::Forced(m), SideRequest::Auto, SideRequest::Auto)
            .unwrap_err();
        assert!(
            e.msg.contains("no usable GPU") && e.msg.contains("UMP_ALLOC_MODE=host"),
            "{}",
            e.msg
        );
        let e = none.select(ModeRequest::Forced(m)).unwrap_err();
        assert!(
            e.msg.contains("no usable GPU") && e.msg.contains("use mode=\"host\""),
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
fn sides_override_the_mode_and_name_the_fix() {
    let h200 = machine(vec![dev(false, false, true, true)]);
    let s = h200
        .select_sides(
            ModeRequest::Forced(Mode::Managed),
            SideRequest::Forced(HostSide::Pinned),
            SideRequest::Auto,
        )
        .unwrap();
    assert_eq!(
        s.mode,
        Mode::Pinned,
        "managed with a pinned host side is the pinned preset"
    );
    let s = h200
        .select_sides(
            ModeRequest::Auto,
            SideRequest::Forced(HostSide::Managed),
            SideRequest::Forced(DeviceSide::Device),
        )
        .unwrap();
    assert_eq!(s.mode, Mode::Custom);
    assert_eq!(s.host_reason, "UMP_ALLOC_HOST_SIDE=managed");
    let e = h200
        .select_sides(
            ModeRequest::Auto,
            SideRequest::Forced(HostSide::System),
            SideRequest::Auto,
        )
        .unwrap_err();
    assert!(e.msg.contains("UMP_ALLOC_HOST_SIDE=pinned"), "{}", e.msg);
    let none = MachineCaps::no_cuda("no libcuda");
    let e = none
        .select_sides(
            ModeRequest::Auto,
            SideRequest::Auto,
            SideRequest::Forced(DeviceSide::Managed),
        )
        .unwrap_err();
    assert!(
        e.msg.ends_with(
            "no usable GPU (no libcuda); unset UMP_ALLOC_DEVICE_SIDE (or set it to auto): \
             without a usable GPU there is no device side"
        ),
        "{}",
        e.msg
    );
    assert!(!e.msg.contains("use ("), "a hint with no value: {}", e.msg);
}

#[test]
fn names_round_trip() {
    for m in Mode::PRESETS {
        assert_eq!(Mode::parse(m.name()), Some(m));
        assert_eq!(Mode::of(m.sides().unwrap()), m);
    }
    assert_eq!(
        Mode::parse("custom"),
        None,
        "custom is a result, not a request"
    );
    for h in HostSide::ALL {
        assert_eq!(HostSide::parse(h.name()), Some(h));
    }
    for d in DeviceSide::ALL {
        assert_eq!(DeviceSide::parse(d.name()), Some(d));
    }
    assert_eq!(ModeRequest::parse("AUTO"), Ok(ModeRequest::Auto));
    assert!(ModeRequest::parse("").is_err());
}
