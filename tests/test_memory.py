"""core.memory: the block of 2 MiB pages that the weights' interleaved copies live in."""
import mmap
import os
import sys

import numpy as np
import pytest

import ggml_py as gg
from ggml_py.core.memory import HUGE_PAGE, huge_page_bytes
from ggml_py.core.quants import interleave_rows8
from ggml_py.model.weights import MATMUL_FIELDS

from llama_models import model_path

ON_LINUX = sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE")


@pytest.mark.parametrize("nbytes", [0, 1, 4096, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 5])
def test_huge_page_bytes_are_zeroed_writable_and_on_a_huge_page_boundary(nbytes):
    block = huge_page_bytes(nbytes)
    assert block.dtype == np.uint8 and block.shape == (nbytes,) and block.flags.writeable
    assert not block.any()
    if nbytes and ON_LINUX:
        assert block.ctypes.data % HUGE_PAGE == 0
    block[:] = 7                    # every byte is ours
    assert int(block.sum()) == 7 * nbytes


def test_huge_page_bytes_rejects_a_negative_size():
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        huge_page_bytes(-1)


def mapping_of(address):
    """The lines of /proc/self/smaps about the mapping that holds address."""
    lines, inside = [], False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:      # a mapping's first line: its address range
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside:
                lines.append(line)
    return lines


@pytest.mark.skipif(not ON_LINUX or not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
                    reason="Linux with transparent huge pages")
def test_huge_page_bytes_ask_for_2_mib_pages():
    block = huge_page_bytes(8 * HUGE_PAGE)
    block[::4096] = 1               # touch every small page
    info = mapping_of(block.ctypes.data)
    flags = [line.split()[1:] for line in info if line.startswith("VmFlags:")]
    assert flags and "hg" in flags[0]           # MADV_HUGEPAGE taken
    # whether the system gave them is its own choice (none free, huge pages off): not asserted
    huge_kb = [int(line.split()[1]) for line in info if line.startswith("AnonHugePages:")]
    assert huge_kb and huge_kb[0] % 2048 == 0


def test_interleave_rows8_writes_into_out():
    raw = np.random.default_rng(0).integers(0, 256, (16, 3 * 18), dtype=np.uint8)
    want = interleave_rows8(raw, "Q4_0")
    out = np.zeros_like(raw)
    assert interleave_rows8(raw, "Q4_0", out=out) is out
    np.testing.assert_array_equal(out, want)
    bad = {"a shape": np.zeros((8, 54), np.uint8), "a dtype": np.zeros((16, 54), np.int8),
           "a strided view": np.zeros((16, 108), np.uint8)[:, ::2], "a list": [0] * 864}
    read_only = np.zeros_like(raw)
    read_only.flags.writeable = False
    bad["read-only memory"] = read_only
    for what, out in bad.items():
        with pytest.raises(ValueError, match="out must be a writable C-contiguous uint8 array"):
            interleave_rows8(raw, "Q4_0", out=out)
    with pytest.raises(ValueError, match="out overlaps the weights"):
        interleave_rows8(raw, "Q4_0", out=raw)


def test_with_rows8_puts_every_copy_in_one_block():
    llm = gg.Llama(model_path("q4_0"), n_ctx=32, n_threads=1)
    weights = llm.model.weights
    copies = [getattr(lw, name).rows8 for lw in weights.layers for name in MATMUL_FIELDS]
    copies = [c for c in copies if c is not None]
    assert copies
    if weights.output.rows8 is not None:
        copies.append(weights.output.rows8)
    block = copies[0].base
    assert block is not None and all(c.base is block for c in copies)   # one block
    assert all(c.ctypes.data % 64 == 0 for c in copies)
    ends = sorted((c.ctypes.data, c.ctypes.data + c.nbytes) for c in copies)
    assert all(e0[1] <= e1[0] for e0, e1 in zip(ends, ends[1:]))   # none overlaps another
    for lw in weights.layers:
        for name in MATMUL_FIELDS:
            w = getattr(lw, name)
            if w.rows8 is not None:
                np.testing.assert_array_equal(w.rows8, interleave_rows8(w.data, w.type))
