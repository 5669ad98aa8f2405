"""memory_summary() and pool_stats() on the host side (CPU): real numbers of the pools, in a fresh
interpreter so that nothing else allocated before."""

from conftest import run_python


def test_pool_stats_and_summary_show_the_host_pool():
    r = run_python(
        r"""
import numpy as np, ump_alloc
ump_alloc.enable()
keep = np.ones(3_000_000)            # 24 MB: a large block
gone = np.ones(2_000_000); del gone  # 16 MB freed: cached
(p,) = [x for x in ump_alloc.pool_stats() if x["device"] == -1 and not x["fallback"]]
assert p["mapped"] >= 40 * 2**20 and p["cached"] >= 16 * 2**20, p
assert 16 * 2**20 <= p["largest_free"] <= p["cached"], p
s = ump_alloc.memory_summary()
print(s)
assert "host side (NumPy)" in s and "largest free" in s and "MiB" in s
assert "device side: nothing allocated" in s
""",
        env={"UMP_ALLOC_MODE": "host"},
    )
    assert "host side (NumPy)" in r.stdout
