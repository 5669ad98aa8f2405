"""Concurrency: 16 threads allocate and free through the C ABI (ctypes releases the GIL)."""

import ctypes
import threading

import numpy as np

import ump_alloc


def test_16_thread_churn(lib):
    errors = []
    before = lib.ump_error_count()

    def churn(tid):
        rng = np.random.default_rng(tid)
        sizes = rng.integers(1, 8192, 4000)
        sizes[::50] = rng.integers(300_000, 3_000_000, len(sizes[::50]))
        live = []
        try:
            for i, n in enumerate(sizes):
                n = int(n)
                p = lib.ump_malloc(n)
                assert p and p % ump_alloc.block_alignment(n) == 0
                tag = bytes([(tid * 31 + i) & 0xFF]) * 8
                ctypes.memmove(p, tag, 8)
                ctypes.memmove(p + n - 8 if n >= 8 else p, tag, min(8, n))
                live.append((p, n, tag))
                if len(live) > 32:
                    q, m, t = live.pop(int(rng.integers(0, len(live))))
                    assert ctypes.string_at(q, min(8, m)) == t[: min(8, m)], "block overwritten"
                    assert ump_alloc.identify(q + m // 2).ours
                    lib.ump_free(q, m)
            for q, m, _ in live:
                lib.ump_free(q, m)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=churn, args=(t,)) for t in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert lib.ump_error_count() == before


def test_threads_share_blocks(lib):
    """Blocks allocated on one thread and freed on another."""
    ptrs = [lib.ump_malloc(int(n)) for n in np.random.default_rng(0).integers(1, 100_000, 2000)]
    chunks = [ptrs[i::8] for i in range(8)]
    before = lib.ump_error_count()

    def free_all(ps):
        for p in ps:
            lib.ump_free(p, 0)

    ts = [threading.Thread(target=free_all, args=(c,)) for c in chunks]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert lib.ump_error_count() == before
    assert not any(ump_alloc.identify(p).ours for p in ptrs)
