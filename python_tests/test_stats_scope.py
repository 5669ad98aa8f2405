"""Statistics and scopes from Python (CPU; the GPU side is in gpu_checks.py)."""

import numpy as np
import pytest

import ump_alloc


def test_stats_follow_numpy_allocations(ump):
    import gc

    # Garbage of earlier tests (a closed dask cluster's objects, reference cycles) may be freed
    # between two snapshots; collect it first and keep the collector off while measuring.
    rng = np.random.default_rng(1)
    gc.collect()
    gc.disable()
    try:
        _stats_follow(rng)
    finally:
        gc.enable()


def _stats_follow(rng):
    ump_alloc.reset_peak()
    s0 = ump_alloc.stats()
    assert s0["version"] == 4 and s0["mode"] != "unset"
    assert s0["fork_held"] == {"bytes": 0, "blocks": 0}, "no fork child, nothing held back"
    a = rng.random(1 << 20)  # 8 MiB
    s1 = ump_alloc.stats()
    assert ump_alloc.handles(a)
    assert s1["host"]["in_use"] >= a.nbytes
    assert s1["host"]["in_use"] - s0["host"]["in_use"] >= a.nbytes - (1 << 20), (s0["host"], s1["host"])
    assert s1["host"]["in_use_peak"] >= s1["host"]["in_use"]
    assert s1["host"]["allocs"] > s0["host"]["allocs"]
    assert s1["kinds"][s1["host_kind"]]["in_use"] >= s1["host"]["in_use"]
    peak = s1["host"]["in_use_peak"]
    del a
    s2 = ump_alloc.stats()
    assert s2["host"]["in_use"] <= s1["host"]["in_use"] - (8 << 20)
    assert s2["host"]["in_use_peak"] == peak
    assert s2["host"]["cached"] >= 8 << 20
    # Layout (version 3): address space held, the largest free block, fragmentation.
    h = s2["host"]
    assert h["reserved"] >= h["mapped"] - h["cached"] > 0, h
    assert 0 < h["largest_free"] <= h["cached"], h
    assert h["fragmentation"] == pytest.approx(1 - h["largest_free"] / h["cached"]), h
    ump_alloc.reset_peak()
    assert ump_alloc.stats()["host"]["in_use_peak"] == ump_alloc.stats()["host"]["in_use"]


def test_stats_count_errors(lib):
    before = ump_alloc.stats()["errors"]
    lib.ump_free(0x10, 1)
    after = ump_alloc.stats()["errors"]
    assert after["total"] == before["total"] + 1
    assert after["invalid_free"] == before["invalid_free"] + 1
    lib.ump_clear_error()


def test_scope_reports_and_never_frees_live_arrays(ump):
    with ump_alloc.scope() as s:
        kept = np.arange(100_000, dtype=np.float64)
        tmp = np.ones(50_000) * 3
        del tmp
    r = s.report
    assert r.allocs >= 3 and r.frees >= 2
    assert r.live_blocks == 1 and r.live_bytes == kept.nbytes
    assert r.peak_bytes >= kept.nbytes + 50_000 * 8
    # The escaped array is intact and still ours.
    assert ump_alloc.handles(kept) and kept[-1] == 99_999.0
    assert ump_alloc.stats()["scopes_open"] == 0


def test_scope_loop_is_flat(ump):
    rng = np.random.default_rng(2)
    mapped = []
    for i in range(1000):
        with ump_alloc.scope():
            x = rng.random(int(rng.integers(10, 200_000)))
            y = np.sqrt(x) + i
            assert y[0] >= i
        if i >= 10:
            mapped.append(ump_alloc.stats()["host"]["mapped"])
    assert mapped[0] == mapped[-1], f"memory grew: {mapped[0]} -> {mapped[-1]}"


def test_scope_collect_frees_cycles(ump):
    import gc

    gc.disable()
    try:
        with ump_alloc.scope(collect=True) as s:
            a = np.empty(1 << 18)
            cycle = [a]
            cycle.append(cycle)
            del a, cycle
    finally:
        gc.enable()
    assert s.report.live_blocks == 0, s.report


def test_scope_errors(lib):
    assert lib.ump_scope_end() == 2  # UMP_ERR_INVALID: no scope open
    assert lib.ump_scope_begin_ex(0x40) == 2
    assert lib.ump_scope_keep(None) == 1  # UMP_ERR_NULL
    lib.ump_clear_error()
    with pytest.raises(ump_alloc.UmpError):
        ump_alloc.scope().__exit__(None, None, None)
