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
errors = ump_alloc.stats()["errors"]["total"]
ump_alloc.pool_stats(); ump_alloc.pool_stats()
assert ump_alloc.stats()["errors"]["total"] == errors, "the end of the pool list is not an error"
assert ump_alloc.last_error() is None
s = ump_alloc.memory_summary()
print(s)
assert "host side (NumPy)" in s and "largest free" in s and "MiB" in s
assert ", 0 errors" in s, s
assert "device side: nothing allocated" in s
""",
        env={"UMP_ALLOC_MODE": "host"},
    )
    assert "host side (NumPy)" in r.stdout


def test_largest_free_block_after_frees_and_merges_and_the_table_layout():
    r = run_python(
        r"""
import numpy as np, ump_alloc
from ump_alloc import _summary
ump_alloc.enable()
MB = 2**20
def host():
    (p,) = [x for x in ump_alloc.pool_stats() if x["device"] == -1 and not x["fallback"]]
    return p
a = np.ones(8 * MB, np.uint8); b = np.ones(8 * MB, np.uint8); c = np.ones(8 * MB, np.uint8)
base = host()["largest_free"]
del b                                  # a hole between a and c: the largest block stays the tail
assert host()["largest_free"] == base, (host(), base)
del c                                  # b, c and the tail merge into one block
assert host()["largest_free"] >= base + 16 * MB, (host(), base)
s = ump_alloc.memory_summary()
print(s)
lines = s.splitlines()
header = [l for l in lines if "largest free" in l][0]
assert [c.strip() for c in header.split("|")[1:]] == list(_summary.COLUMNS)
rows = [l for l in lines if "|" in l]
assert len({l.count("|") for l in rows}) == 1, "every row has every column"
assert len({len(l) for l in rows}) == 1, "columns line up"
(host_row,) = [l for l in rows if l.startswith("host side (NumPy)")]
cells = [c.strip() for c in host_row.split("|")[1:]]
assert cells[_summary.COLUMNS.index("largest free")] == _summary._size(host()["largest_free"]), cells
assert cells[_summary.COLUMNS.index("in use")] == _summary._size(ump_alloc.stats()["host"]["in_use"]), cells
assert "device side: nothing allocated (no GPU, host mode, or no GPU library used)" in s
assert not any(l.lstrip().startswith("stream ") for l in lines), "host mode: no stream rows"
""",
        env={"UMP_ALLOC_MODE": "host"},
    )
    assert "ump-alloc memory summary: mode host" in r.stdout


def test_size_and_count_formatting():
    from ump_alloc import _summary

    assert _summary._size(None) == "-" and _summary._size(0) == "0 B" and _summary._size(1023) == "1023 B"
    assert _summary._size(1536) == "1.50 KiB" and _summary._size(3 << 30) == "3.00 GiB"
    assert _summary._size(5 << 40) == "5.00 TiB" and _summary._size(5 << 50) == "5120.00 TiB"
    assert _summary._count(None) == "-" and _summary._count(1234567) == "1,234,567"


def test_stats_command_prints_the_summary():
    r = run_python("import ump_alloc.__main__ as m; raise SystemExit(m.main(['stats']))", env={"UMP_ALLOC_MODE": "host"})
    assert "ump-alloc memory summary" in r.stdout and "host side (NumPy)" in r.stdout
