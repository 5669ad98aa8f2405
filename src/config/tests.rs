//! Tests of the configuration table (`src/config.rs`).

use super::*;
use std::collections::HashMap;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

#[test]
fn switches_are_strict() {
    let c = cfg(&[
        ("UMP_ALLOC_TORCH_UNIFIED", "1"),
        ("UMP_ALLOC_TORCH_FAST_CPU", " 0"),
    ])
    .unwrap();
    assert!(c.torch_unified && !c.torch_fast_cpu && !c.cupy_zero_copy);
    for bad in ["true", "2", "yes", "01"] {
        let e = cfg(&[("UMP_ALLOC_CUPY_ZERO_COPY", bad)]).unwrap_err();
        assert!(
            e.msg.contains("UMP_ALLOC_CUPY_ZERO_COPY") && e.msg.contains("0 or 1"),
            "{}",
            e.msg
        );
    }
}

#[test]
fn numpy_route_is_one_of_two() {
    for ok in ["native", " numpy_allocator "] {
        assert!(cfg(&[("UMP_ALLOC_NUMPY_ROUTE", ok)]).is_ok(), "{ok}");
    }
    for bad in ["numpy-allocator", "Native", "1"] {
        let e = cfg(&[("UMP_ALLOC_NUMPY_ROUTE", bad)]).unwrap_err();
        assert!(
            e.msg.contains("UMP_ALLOC_NUMPY_ROUTE") && e.msg.contains("numpy_allocator"),
            "{}",
            e.msg
        );
    }
}

#[test]
fn defaults() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.alignment, 512);
}

#[test]
fn defaults_are_those_of_before_the_table_carried_them() {
    // The hand-written `Default` the rows replaced (issue 24), field by field.
    let before = Config {
        mode: ModeRequest::Auto,
        host_side: SideRequest::Auto,
        device_side: SideRequest::Auto,
        pinned_limit: PinnedLimit::Percent(50),
        pinned_fork: PinnedFork::Share,
        pin: Pin::Lazy,
        alignment: 512,
        limit: None,
        host_retain: 256 << 20,
        prefetch_min: 64 << 10,
        headroom: 0,
        device_vmm: true,
        managed_discard: true,
        oversubscribe: false,
        torch_route: TorchRoute::Segments,
        torch_segments: TorchSegments::Auto,
        torch_fast_cpu: true,
        torch_unified: false,
        cupy_zero_copy: false,
        no_cuda: false,
    };
    assert_eq!(Config::default(), before);
}

#[test]
fn every_field_has_a_row() {
    // Read from a start that differs from `unread()` in every field: each field a row
    // writes ends up the same, so a field no row writes would show here.
    let other = Config {
        mode: ModeRequest::Forced(crate::mode::Mode::Host),
        host_side: SideRequest::Forced(HostSide::Managed),
        device_side: SideRequest::Forced(DeviceSide::Device),
        pinned_limit: PinnedLimit::Percent(7),
        pinned_fork: PinnedFork::Share,
        pin: Pin::Lazy,
        alignment: 7,
        limit: Some(7),
        host_retain: 7,
        prefetch_min: 7,
        headroom: 7,
        device_vmm: true,
        managed_discard: true,
        oversubscribe: true,
        torch_route: TorchRoute::Segments,
        torch_segments: TorchSegments::Auto,
        torch_fast_cpu: true,
        torch_unified: true,
        cupy_zero_copy: true,
        no_cuda: false,
    };
    // `other` differs from `unread()` in every field (no `..`: a new field must come here).
    let u = Config::unread();
    let Config {
        mode,
        host_side,
        device_side,
        pinned_limit,
        pinned_fork,
        pin,
        alignment,
        limit,
        host_retain,
        prefetch_min,
        headroom,
        device_vmm,
        managed_discard,
        oversubscribe,
        torch_route,
        torch_segments,
        torch_fast_cpu,
        torch_unified,
        cupy_zero_copy,
        no_cuda,
    } = other.clone();
    assert!(
        mode != u.mode
            && host_side != u.host_side
            && device_side != u.device_side
            && pinned_limit != u.pinned_limit
            && pinned_fork != u.pinned_fork
            && pin != u.pin
            && alignment != u.alignment
            && limit != u.limit
            && host_retain != u.host_retain
            && prefetch_min != u.prefetch_min
            && headroom != u.headroom
            && device_vmm != u.device_vmm
            && managed_discard != u.managed_discard
            && oversubscribe != u.oversubscribe
            && torch_route != u.torch_route
            && torch_segments != u.torch_segments
            && torch_fast_cpu != u.torch_fast_cpu
            && torch_unified != u.torch_unified
            && cupy_zero_copy != u.cupy_zero_copy
            && no_cuda != u.no_cuda
    );
    let from_other = Config::read_rows(other.clone(), |_| None).unwrap();
    assert_eq!(from_other, Config::default());
    // Control: a start read by no row keeps its own values.
    assert_ne!(other, Config::default());
}

#[test]
fn rows_are_ascii_and_unique() {
    let mut names = std::collections::HashSet::new();
    for v in VARS {
        for text in [v.name, v.default, v.help] {
            assert!(text.to_str().is_ok_and(|t| t.is_ascii()), "{text:?}");
        }
        assert!(names.insert(v.name()), "{} twice", v.name());
        assert!(v.name().starts_with("UMP_ALLOC"), "{}", v.name());
    }
}

#[test]
fn several_bad_values_report_the_first_in_the_table() {
    // The environment is read in the table's (and info's) order. Before the rows carried
    // their parsers, `from_lookup` had an order of its own: UMP_ALLOC_MODE, then UMP_ALLOC;
    // the switches, then UMP_ALLOC_TORCH_ROUTE.
    let e = cfg(&[("UMP_ALLOC_MODE", "turbo"), ("UMP_ALLOC", "yes")]).unwrap_err();
    assert!(e.msg.starts_with("UMP_ALLOC=\"yes\": "), "{}", e.msg);
    let bad = [
        ("UMP_ALLOC_TORCH_FAST_CPU", "2"),
        ("UMP_ALLOC_TORCH_ROUTE", "mempool"),
    ];
    let e = cfg(&bad).unwrap_err();
    assert!(
        e.msg.starts_with("UMP_ALLOC_TORCH_ROUTE=\"mempool\": "),
        "{}",
        e.msg
    );
}

#[test]
fn alignment_valid_and_invalid() {
    assert_eq!(
        cfg(&[("UMP_ALLOC_ALIGNMENT", "4096")]).unwrap().alignment,
        4096
    );
    assert_eq!(cfg(&[("UMP_ALLOC_ALIGNMENT", "16")]).unwrap().alignment, 16);
    for bad in ["3", "8", "0", "-16", "abc", "131072", "1e3"] {
        let e = cfg(&[("UMP_ALLOC_ALIGNMENT", bad)]).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_CONFIG, "{bad}");
        assert!(e.msg.contains("UMP_ALLOC_ALIGNMENT"), "{}", e.msg);
    }
}

#[test]
fn empty_value_is_unset() {
    assert_eq!(
        cfg(&[("UMP_ALLOC_ALIGNMENT", "  ")]).unwrap().alignment,
        512
    );
}

#[test]
fn bytes() {
    assert_eq!(parse_bytes("1024").unwrap(), 1024);
    assert_eq!(parse_bytes("4k").unwrap(), 4096);
    assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
    assert_eq!(parse_bytes("8GiB").unwrap(), 8 << 30);
    assert_eq!(parse_bytes("2GB").unwrap(), 2 << 30);
    assert!(parse_bytes("x").is_err());
    assert!(parse_bytes("99999999999999999999T").is_err());
    assert_eq!(cfg(&[("UMP_ALLOC_LIMIT", "none")]).unwrap().limit, None);
    assert_eq!(
        cfg(&[("UMP_ALLOC_LIMIT", "1G")]).unwrap().limit,
        Some(1 << 30)
    );
    assert!(cfg(&[("UMP_ALLOC_LIMIT", "lots")]).is_err());
    assert!(
        cfg(&[("UMP_ALLOC_LIMIT", "0")]).is_err(),
        "0 would fail every allocation"
    );
    assert!(cfg(&[("UMP_ALLOC_LIMIT", "0G")]).is_err());
    assert_eq!(parse_limit(" None "), Ok(None));
}

#[test]
fn limits_below_one_arena_are_refused_with_the_minimum() {
    // Each of these was accepted, then failed every allocation (a 48-byte array included).
    for bad in ["1", "64K", "128K", "1M", "63M", "67108863"] {
        let e = cfg(&[("UMP_ALLOC_LIMIT", bad)]).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_CONFIG, "{bad}");
        assert!(
            e.msg.starts_with(&format!("UMP_ALLOC_LIMIT={bad:?}: "))
                && e.msg.contains("below the minimum of 64M"),
            "{}",
            e.msg
        );
    }
    assert_eq!(MIN_LIMIT, crate::backing::ARENA);
    assert_eq!(
        cfg(&[("UMP_ALLOC_LIMIT", "64M")]).unwrap().limit,
        Some(64 << 20)
    );
    assert_eq!(parse_limit("67108864"), Ok(Some(MIN_LIMIT)));
}

#[test]
fn pinned_limits_follow_the_same_minimum() {
    // One rule for both byte limits: "1" was accepted as a pinned cap ("1 bytes", pinning
    // nothing) while UMP_ALLOC_LIMIT=1 was refused.
    for bad in ["1", "64K", "1M", "63M", "67108863"] {
        for name in ["UMP_ALLOC_LIMIT", "UMP_ALLOC_PINNED_LIMIT"] {
            let e = cfg(&[(name, bad)]).unwrap_err();
            assert_eq!(
                e.status,
                crate::error::Status::UMP_ERR_CONFIG,
                "{name}={bad}"
            );
            assert!(
                e.msg.starts_with(&format!("{name}={bad:?}: "))
                    && e.msg.contains("below the minimum of 64M"),
                "{}",
                e.msg
            );
        }
    }
    let e = cfg(&[("UMP_ALLOC_PINNED_LIMIT", "1")]).unwrap_err();
    assert!(
        e.msg.contains("pins none of NumPy's arrays under 32 MiB")
            && e.msg.ends_with("or a percentage of memory such as 50%"),
        "{}",
        e.msg
    );
    // 0 would pin nothing: the setting for that is the host side.
    let e = cfg(&[("UMP_ALLOC_PINNED_LIMIT", "0")]).unwrap_err();
    assert!(e.msg.ends_with("set UMP_ALLOC_HOST_SIDE=host"), "{}", e.msg);
    assert_eq!(
        cfg(&[("UMP_ALLOC_PINNED_LIMIT", "64M")])
            .unwrap()
            .pinned_limit,
        PinnedLimit::Bytes(MIN_LIMIT)
    );
    // Percentages keep their own rule (1% ..= 100% of memory).
    assert_eq!(
        cfg(&[("UMP_ALLOC_PINNED_LIMIT", "1%")])
            .unwrap()
            .pinned_limit,
        PinnedLimit::Percent(1)
    );
    // UMP_ALLOC_LIMIT's own messages are unchanged.
    assert_eq!(
        parse_limit("0").unwrap_err(),
        "a limit of 0 bytes would fail every allocation; use a positive size such as 8G, or \
         \"none\" (or leave it unset) for no limit"
    );
    assert!(parse_limit("1").unwrap_err().ends_with(
        "a smaller limit fails nearly every allocation; the value counts bytes \
                        (K, M, G, T: powers of 1024), so use a size such as 8G, or \"none\" \
                        for no limit"
    ));
}

#[test]
fn describe_shows_the_parsed_value() {
    let d = |n: &str, v: &str| describe(n, v, 16 << 30);
    assert_eq!(
        d("UMP_ALLOC_LIMIT", "8GB").unwrap(),
        "8 GiB (8589934592 bytes)"
    );
    assert_eq!(d("UMP_ALLOC_LIMIT", " none ").unwrap(), "no limit");
    assert_eq!(
        d("UMP_ALLOC_HOST_RETAIN", "1536M").unwrap(),
        "1.5 GiB (1610612736 bytes)"
    );
    assert_eq!(
        d("UMP_ALLOC_PINNED_LIMIT", "25%").unwrap(),
        // The cap as the pool computes it (memory / 100 * percent).
        "4.0 GiB (4294967275 bytes) of 16 GiB (17179869184 bytes)"
    );
    assert_eq!(d("UMP_ALLOC_ALIGNMENT", "4096").unwrap(), "4096 bytes");
    assert_eq!(d("UMP_ALLOC_MODE", "Managed").unwrap(), "managed");
    assert_eq!(d("UMP_ALLOC_DEVICE_SIDE", "DEVICE").unwrap(), "device");
    assert_eq!(d("UMP_ALLOC_TORCH_UNIFIED", "1").unwrap(), "1 (on)");
    assert_eq!(d("UMP_ALLOC", "0").unwrap(), "0 (off)");
    assert_eq!(d("UMP_ALLOC_PREFETCH_MIN", "1000").unwrap(), "1000 bytes");
    assert_eq!(
        d("UMP_ALLOC_LIBRARY", "/x/libump_alloc.so").unwrap(),
        "/x/libump_alloc.so"
    );
    // Invalid values give the error the configuration gives; unknown names are refused.
    for (n, v) in [
        ("UMP_ALLOC_LIMIT", "64K"),
        ("UMP_ALLOC_ALIGNMENT", "3"),
        ("UMP_ALLOC", "true"),
    ] {
        let e = d(n, v).unwrap_err();
        assert_eq!(e.msg, cfg(&[(n, v)]).unwrap_err().msg);
    }
    let e = d("UMP_ALLOC_MODEE", "host").unwrap_err();
    assert_eq!(e.status, crate::error::Status::UMP_ERR_INVALID);
    // Every row of the table is described (by value or as typed).
    for v in VARS {
        let name = v.name.to_str().unwrap();
        d(name, v.default.to_str().unwrap())
            .unwrap_or_else(|e| panic!("the default of {name}: {}", e.msg));
    }
}

#[test]
fn mode_parse_errors_name_the_variable() {
    let e = cfg(&[("UMP_ALLOC_MODE", "turbo")]).unwrap_err();
    assert!(
        e.msg.contains("UMP_ALLOC_MODE") && e.msg.contains("managed"),
        "{}",
        e.msg
    );
    assert_eq!(
        cfg(&[("UMP_ALLOC_MODE", "Managed")]).unwrap().mode,
        ModeRequest::Forced(crate::mode::Mode::Managed)
    );
}

#[test]
fn sides_and_pinned_limit() {
    let c = cfg(&[
        ("UMP_ALLOC_HOST_SIDE", "Pinned"),
        ("UMP_ALLOC_DEVICE_SIDE", "device"),
        ("UMP_ALLOC_PINNED_LIMIT", "25%"),
    ])
    .unwrap();
    assert_eq!(c.host_side, SideRequest::Forced(HostSide::Pinned));
    assert_eq!(c.device_side, SideRequest::Forced(DeviceSide::Device));
    assert_eq!(c.pinned_limit, PinnedLimit::Percent(25));
    assert_eq!(c.pinned_fork, PinnedFork::Share);
    assert_eq!(
        cfg(&[("UMP_ALLOC_PINNED_FORK", " Copy ")])
            .unwrap()
            .pinned_fork,
        PinnedFork::Copy
    );
    assert_eq!(c.pinned_limit.bytes(1000), 250);
    assert_eq!(
        cfg(&[("UMP_ALLOC_PINNED_LIMIT", "16G")])
            .unwrap()
            .pinned_limit,
        PinnedLimit::Bytes(16 << 30)
    );
    for (k, v) in [
        ("UMP_ALLOC_HOST_SIDE", "device"),
        ("UMP_ALLOC_DEVICE_SIDE", "none"),
        ("UMP_ALLOC_PINNED_LIMIT", "0%"),
        ("UMP_ALLOC_PINNED_LIMIT", "150%"),
        ("UMP_ALLOC_PINNED_LIMIT", "lots"),
        ("UMP_ALLOC_PINNED_FORK", "shared"),
        ("UMP_ALLOC_PINNED_FORK", "1"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert!(e.msg.contains(k), "{}", e.msg);
    }
}

#[test]
fn torch_route_and_oversubscription() {
    let c = cfg(&[]).unwrap();
    assert_eq!(c.torch_route, TorchRoute::Segments);
    assert!(!c.oversubscribe, "oversubscription is opt-in");
    let c = cfg(&[
        ("UMP_ALLOC_TORCH_ROUTE", " Swap "),
        ("UMP_ALLOC_OVERSUBSCRIBE", "1"),
    ])
    .unwrap();
    assert_eq!(c.torch_route, TorchRoute::Swap);
    assert!(c.oversubscribe);
    for (k, v) in [
        ("UMP_ALLOC_TORCH_ROUTE", "mempool"),
        ("UMP_ALLOC_OVERSUBSCRIBE", "yes"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert!(e.msg.contains(k), "{}", e.msg);
    }
}

#[test]
fn table_names_every_variable_read() {
    for name in [
        "UMP_ALLOC_HOST_SIDE",
        "UMP_ALLOC_DEVICE_SIDE",
        "UMP_ALLOC_PINNED_LIMIT",
        "UMP_ALLOC_PINNED_FORK",
        "UMP_ALLOC_PREFETCH_MIN",
        "UMP_ALLOC_MODE",
        "UMP_ALLOC_ALIGNMENT",
        "UMP_ALLOC_LIMIT",
        "UMP_ALLOC_HOST_RETAIN",
        "UMP_ALLOC_OVERSUBSCRIBE",
        "UMP_ALLOC_TORCH_ROUTE",
    ] {
        assert!(VARS.iter().any(|v| v.name.to_str() == Ok(name)), "{name}");
    }
}

#[test]
fn pin_and_torch_segments_read_their_values_and_refuse_others() {
    let c = cfg(&[
        ("UMP_ALLOC_PIN", " EAGER"),
        ("UMP_ALLOC_TORCH_SEGMENTS", "side"),
    ])
    .unwrap();
    assert_eq!((c.pin, c.torch_segments), (Pin::Eager, TorchSegments::Side));
    let c = cfg(&[("UMP_ALLOC_TORCH_SEGMENTS", "device")]).unwrap();
    assert_eq!(
        (c.pin, c.torch_segments),
        (Pin::Lazy, TorchSegments::Device)
    );
    let e = cfg(&[("UMP_ALLOC_PIN", "now")]).unwrap_err();
    assert!(
        e.msg.contains("UMP_ALLOC_PIN=\"now\"") && e.msg.contains("lazy"),
        "{}",
        e.msg
    );
    let e = cfg(&[("UMP_ALLOC_TORCH_SEGMENTS", "managed")]).unwrap_err();
    assert!(e.msg.contains("expected auto, device"), "{}", e.msg);
}

#[test]
fn setting_reads_one_variable_through_its_row() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    // Unset or empty: the row's default; set: the value as typed, trimmed.
    assert_eq!(
        setting("UMP_ALLOC_TORCH_ROUTE", env(&[])).unwrap(),
        "segments"
    );
    assert_eq!(
        setting(
            "UMP_ALLOC_TORCH_ROUTE",
            env(&[("UMP_ALLOC_TORCH_ROUTE", "  ")])
        )
        .unwrap(),
        "segments"
    );
    assert_eq!(
        setting(
            "UMP_ALLOC_TORCH_ROUTE",
            env(&[("UMP_ALLOC_TORCH_ROUTE", " Swap ")])
        )
        .unwrap(),
        "Swap"
    );
    assert_eq!(setting("UMP_ALLOC_DEVICE_VMM", env(&[])).unwrap(), "1");
    assert_eq!(
        setting("UMP_ALLOC_NUMPY_ROUTE", env(&[])).unwrap(),
        "native"
    );
    // Another variable's bad value is not this one's business.
    assert_eq!(
        setting("UMP_ALLOC_CUPY_ZERO_COPY", env(&[("UMP_ALLOC_LIMIT", "1")])).unwrap(),
        "0"
    );
    // A bad value: the configuration check's own message; an unknown name: refused.
    for (n, v) in [
        ("UMP_ALLOC_TORCH_ROUTE", "pluggable"),
        ("UMP_ALLOC_CUPY_ZERO_COPY", "yes"),
        ("UMP_ALLOC_NUMPY_ROUTE", "numba"),
    ] {
        let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(n, v)]));
        let e = setting(n, env(pairs)).unwrap_err();
        assert_eq!(e.status, crate::error::Status::UMP_ERR_CONFIG);
        assert_eq!(e.msg, cfg(&[(n, v)]).unwrap_err().msg);
    }
    let e = setting("UMP_ALLOC_ROUTE", env(&[])).unwrap_err();
    assert_eq!(e.status, crate::error::Status::UMP_ERR_INVALID);
    // Every row's default reads.
    for v in VARS {
        let name = v.name.to_str().unwrap();
        assert_eq!(
            setting(name, env(&[])).unwrap(),
            v.default.to_str().unwrap()
        );
    }
}
