"""The device buffers of one plan: inputs, the state pool and its snapshot, the output, and a
flat metadata buffer per index dtype that each set is copied into (one copy per set).

A rig is planned once per backend and capacity; every set binds views of its buffers. Pool
slot i holds pattern[i % PATTERN] (random fp32 states), and `base` keeps a copy, so that the
slots a run changed are found bit for bit (`changed_slots`) and put back (`restore`). A high
rig's sets are rebased past the 2^31-element line of a pool of that size (`slot_base`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from kdabench.fuzz.generate import Limits
from kdabench.fuzz.sets import FuzzSet
from kdabench.inputs import KdaInputs, make_inputs

PATTERN = 16  # distinct random states the pool's slots cycle through
ALIGN = 4  # metadata regions start at multiples of 4 elements (16-byte aligned pointers)
INT32_LINE = 2**31
DTYPES = {"int32": torch.int32, "int64": torch.int64}


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def regions(max_seqs: int, capacity: int) -> dict[str, int]:
    """Start of each metadata region in the flat buffer, and its end."""
    m, c = max_seqs, capacity
    starts, at = {}, 0
    for name, size in (("cu", m + 1), ("initial", m), ("final", m), ("offsets", m * c),
                       ("slots", m * c)):
        starts[name] = at
        at += _aligned(size)
    starts["end"] = at
    return starts


@dataclass
class Rig:
    """One plan and its buffers (see the module docstring)."""

    backend: str
    capacity: int
    limits: Limits
    seed: int
    slot_base: int
    plan: object
    x: KdaInputs
    x_cpu: KdaInputs
    pattern: torch.Tensor
    pool: torch.Tensor
    base: torch.Tensor
    out: torch.Tensor
    meta: dict[str, torch.Tensor] = field(repr=False)

    @property
    def regions(self) -> dict[str, int]:
        return regions(self.limits.max_seqs, self.capacity)

    def bind(self, fset: FuzzSet):
        """Copy the set's metadata into the buffer and bind views of the rig's tensors."""
        from kdabench import kernels

        r, m, c = self.regions, fset.rows, self.capacity
        host = [0] * r["end"]
        for name, values in (("cu", fset.cu_seqlens), ("initial", fset.initial),
                             ("final", fset.final),
                             ("offsets", [v for row in fset.offsets for v in row]),
                             ("slots", [v for row in fset.slots for v in row])):
            host[r[name]: r[name] + len(values)] = values
        buffer = self.meta[fset.index_dtype]
        buffer.copy_(torch.tensor(host, dtype=buffer.dtype))
        shape = (m,) if c == 1 else (m, c)

        def view(name: str, size: int, dims: tuple[int, ...]) -> torch.Tensor:
            return buffer[r[name]: r[name] + size].view(dims)

        t, x = fset.tokens, self.x
        return kernels.bind(
            self.plan, x.q[:t], x.k[:t], x.v[:t], x.g[:t], x.beta[:t],
            state_pool=self.pool[: fset.num_slots], cu_seqlens=view("cu", m + 1, (m + 1,)),
            initial_state_indices=view("initial", m, (m,)),
            final_state_indices=view("final", m, (m,)),
            checkpoint_offsets=view("offsets", m * c, shape),
            checkpoint_state_indices=view("slots", m * c, shape),
            num_seqs=fset.num_seqs, out=self.out[:t], A_log=x.A_log, dt_bias=x.dt_bias,
        )

    def changed_slots(self) -> list[int]:
        """Slots whose bits differ from the snapshot (the whole pool, one sync)."""
        differ = torch.ne(self.pool.view(torch.int32), self.base.view(torch.int32))
        return differ.flatten(1).any(1).nonzero().flatten().tolist()

    def restore(self, slots: list[int]) -> None:
        if slots:
            index = torch.tensor(slots, device=self.pool.device)
            self.pool[index] = self.base[index]

    def initial_states(self, fset: FuzzSet) -> torch.Tensor:
        """Float32 CPU initial state [live, H, V, K] each live sequence reads (zeros for -1)."""
        zeros = torch.zeros_like(self.pattern[0])
        return torch.stack([self.pattern[s % PATTERN] if s >= 0 else zeros
                            for s in fset.initial[: fset.live]])


def high_slot_base(limits: Limits, line: int = INT32_LINE) -> int:
    """The first slot of a high set: one slot below the first that starts past `line`."""
    return math.ceil(line / (limits.heads * limits.head_dim ** 2)) - 1


def interpreter_config(caps):
    """The config of a Triton rig on the CPU: the heuristic's, with one V block per program.
    The interpreter runs a grid's programs one after another, so its cost per set grows with
    the program count (four V blocks of 16 cost a valid set about half again as much); the
    GPU fuzz runs the split V blocks of the device's profile."""
    from dataclasses import replace

    from kdabench.kernels.policy import heuristic_config

    return replace(heuristic_config(caps), block_v=caps.head_dim)


def build_rig(backend: str, capacity: int, limits: Limits, device: torch.device, *,
              seed: int, slot_base: int = 0) -> Rig:
    """Plan once for (backend, capacity) and allocate the buffers every set binds: with the
    policy's config on the GPU, :func:`interpreter_config` on the CPU."""
    from kdabench import kernels

    heads, dim = limits.heads, limits.head_dim
    slots = slot_base + limits.max_slots(capacity)
    caps = kernels.Caps(device=device, num_heads=heads, head_dim=dim,
                        max_tokens=limits.max_tokens, max_seqs=limits.max_seqs,
                        max_state_slots=slots, max_checkpoints=capacity, backend=backend)
    on_cpu = device.type == "cpu" and backend == "triton"
    plan = kernels.plan(caps, interpreter_config(caps) if on_cpu else None)
    x_cpu = make_inputs([limits.max_tokens], heads, dim, with_initial_state=False, seed=seed)
    x = make_inputs([limits.max_tokens], heads, dim, with_initial_state=False, seed=seed,
                    device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    pattern = torch.randn(PATTERN, heads, dim, dim, generator=gen)
    pool = torch.empty(slots, heads, dim, dim, device=device)
    full = slots // PATTERN
    on_device = pattern.to(device)
    pool[: full * PATTERN].view(full, PATTERN, heads, dim, dim).copy_(
        on_device.expand(full, *on_device.shape))
    pool[full * PATTERN:] = on_device[: slots - full * PATTERN]
    size = regions(limits.max_seqs, capacity)["end"]
    meta = {name: torch.zeros(size, dtype=dtype, device=device) for name, dtype in DTYPES.items()}
    out = torch.empty(limits.max_tokens, heads, dim, dtype=torch.bfloat16, device=device)
    return Rig(backend, capacity, limits, seed, slot_base, plan, x, x_cpu, pattern, pool,
               pool.clone(), out, meta)
