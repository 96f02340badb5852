"""Bounds checking for kernels run by the Triton interpreter (the CPU tier of `kdabench
qualify` and of the tests installs it).

The interpreter turns every pointer into a host address and reads or writes it without a
check, so a kernel that reads past a tensor passes the CPU tier and faults on the GPU (or,
worse, reads a neighbour's bytes there). Once `install()` has run, every masked-on address of
every interpreted load and store must lie inside the storage of one of the launch's tensor
arguments, else the launch raises OutOfBoundsAccess naming the kernel, the access and the
nearest argument. A GPU's allocator rounds allocations up, so this is stricter than the device:
it also catches reads that happen to land in padding there.

Atomics and tensor descriptors, which the kernels do not use, are not checked. It wraps three
interpreter internals (GridExecutor._init_args_hst and InterpreterBuilder's
create_masked_load / create_masked_store, present in triton 3.6 and 3.9); `install()` says
False, changing nothing, where they are missing.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class OutOfBoundsAccess(AssertionError):
    """An interpreted load or store outside every tensor argument of its launch."""


class _Launch:
    """The running launch's kernel name and its arguments' storages, sorted by address."""

    kernel = "?"
    starts = np.zeros(0, dtype=np.uint64)
    ends = np.zeros(0, dtype=np.uint64)
    names: ClassVar[list[str]] = []

    @classmethod
    def record(cls, kernel: str, named_args: list[tuple[str, object]]) -> None:
        spans: dict[int, tuple[int, str]] = {}
        for name, arg in named_args:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                start = storage.data_ptr()
                spans.setdefault(start, (start + storage.nbytes(), name))
        order = sorted(spans)
        cls.kernel = kernel
        cls.starts = np.array(order, dtype=np.uint64)
        cls.ends = np.array([spans[s][0] for s in order], dtype=np.uint64)
        cls.names = [spans[s][1] for s in order]


def _check(ptrs, mask, access: str, element_bytes: int) -> None:
    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    live = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
    addresses = addresses[live]
    if addresses.size == 0:
        return
    index = np.searchsorted(_Launch.starts, addresses, side="right").astype(np.int64) - 1
    inside = (index >= 0) & (addresses + np.uint64(element_bytes)
                             <= _Launch.ends[np.maximum(index, 0)])
    if inside.all():
        return
    bad = int(addresses[~inside][0])
    where = "no tensor argument"
    if len(_Launch.starts):
        nearest = int(np.argmin(np.abs(_Launch.starts.astype(np.int64) - bad)))
        start, end = int(_Launch.starts[nearest]), int(_Launch.ends[nearest])
        where = (f"byte {bad - start} of the storage of argument {_Launch.names[nearest]!r} "
                 f"({end - start} bytes long)")
    raise OutOfBoundsAccess(f"{_Launch.kernel}: {access} of {int((~inside).sum())} "
                            f"address(es) outside its arguments, the first at {where}")


def install() -> bool:
    """Wrap the interpreter's argument staging, loads and stores (once); False when this
    triton lacks the internals it wraps."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    executor, builder = interpreter.GridExecutor, interpreter.InterpreterBuilder
    needed = (hasattr(executor, "_init_args_hst") and hasattr(builder, "create_masked_load")
              and hasattr(builder, "create_masked_store") and hasattr(interpreter,
                                                                      "_get_np_dtype"))
    if not needed:
        return False
    if getattr(builder, "_kdabench_memcheck", False):
        return True
    stage, load, store = (executor._init_args_hst, builder.create_masked_load,
                          builder.create_masked_store)

    def element_bytes(ptrs) -> int:
        return np.dtype(interpreter._get_np_dtype(ptrs.get_element_ty())).itemsize

    def staged(self, args_dev, kwargs):
        args_hst, kwargs_hst = stage(self, args_dev, kwargs)
        named = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        _Launch.record(getattr(self.fn, "__name__", "?"), named)
        return args_hst, kwargs_hst

    def checked_load(self, ptrs, mask, *rest):
        _check(ptrs, mask, "load", element_bytes(ptrs))
        return load(self, ptrs, mask, *rest)

    def checked_store(self, ptrs, value, mask, *rest):
        _check(ptrs, mask, "store", element_bytes(ptrs))
        return store(self, ptrs, value, mask, *rest)

    executor._init_args_hst = staged
    builder.create_masked_load = checked_load
    builder.create_masked_store = checked_store
    builder._kdabench_memcheck = True
    return True
