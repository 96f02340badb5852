"""The interpreter's bounds check (kdabench.interp_memcheck), which conftest and the CPU tier of
`kdabench qualify` install: it must reject reads and writes past a tensor and pass masked-off
ones."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kdabench import interp_memcheck

pytestmark = pytest.mark.interpreter


@triton.jit
def _shifted_copy(src, dst, shift, n, N: tl.constexpr, MASKED: tl.constexpr):
    rows = tl.arange(0, N)
    live = (rows + shift < n) if MASKED else rows >= 0
    tl.store(dst + rows, tl.load(src + rows + shift, mask=live, other=0.0), mask=rows < n)


@triton.jit
def _store_past_end(dst, N: tl.constexpr):
    tl.store(dst + tl.arange(0, N) + 1, tl.zeros((N,), tl.float32))


def test_memcheck_is_installed():
    assert interp_memcheck.install(), "the interpreter's internals moved: update interp_memcheck"


def test_in_bounds_and_masked_off_accesses_pass():
    src, dst = torch.arange(16.0), torch.zeros(16)
    _shifted_copy[(1,)](src, dst, 0, 16, N=16, MASKED=False)
    assert torch.equal(dst, src)
    _shifted_copy[(1,)](src, dst, 3, 16, N=16, MASKED=True)  # the 3 rows past the end masked off
    assert torch.equal(dst, torch.cat([src[3:], torch.zeros(3)]))


def test_read_one_element_past_the_end_is_caught():
    # one storage for both arguments, src at its end: no other allocation can sit past src
    storage = torch.arange(32.0)
    dst, src = storage[:16], storage[16:]
    with pytest.raises(Exception, match=r"_shifted_copy: load of 1 address.*byte 128 of .*'src' \(128 bytes"):
        _shifted_copy[(1,)](src, dst, 1, 16, N=16, MASKED=False)


def test_write_past_the_end_is_caught():
    with pytest.raises(Exception, match=r"_store_past_end: store of 1 address.*'dst'"):
        _store_past_end[(1,)](torch.zeros(16), N=16)
