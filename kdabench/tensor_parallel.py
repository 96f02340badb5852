"""The tensor-parallel case: the heads of one layer split across ranks, checked bit for bit.

    from kdabench.tensor_parallel import run_tensor_parallel

    result = run_tensor_parallel(2, backend="nccl", device="cuda")   # one rank per GPU
    result = run_tensor_parallel(2, backend="gloo", device="cpu")    # Triton interpreter
    result["verdict"], result["checks"]["output_bitwise_equal"], result["errors"]

One process per rank (torch.multiprocessing spawn, torch.distributed over
tcp://127.0.0.1:<free port>, NVLink multicast off: NCCL_NVLS_ENABLE=0 and the others of
:data:`kdabench.qualify.parallel.MULTICAST_OFF`). Every rank draws the same seeded inputs
(kdabench.inputs) and metadata (kdabench.qualify.metadata: slots for the initial and final
states and `capacity` checkpoints per sequence), keeps heads
[rank * H/W, (rank + 1) * H/W), builds its own state pool over those heads and runs
`kda_prefill` on them. The outputs and the exported states (every final and checkpoint
slot) are gathered to rank 0 (all_gather; bf16 outputs travel as bytes, bit for bit), which
then runs all heads in one call on its own device and checks:

- bitwise: the gathered outputs and exported states `torch.equal` the one-process run
  (heads are independent in the kernel and its configuration does not depend on H);
- the float64 recurrence (kdabench.oracles.recurrent_kda): relative Frobenius error of the
  outputs <= 5e-3 and of the final states and checkpoints <= 3e-3;
- every rank's error code is 0 and no pool slot that nothing names was written.

`qualify_tensor_parallel` wraps one run as a receipt (kind "qualify", one case of scenario
"tensor-parallel"); `kdabench qualify --tp N` calls it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kdabench.inputs import make_inputs
from kdabench.oracles import recurrent_kda, relative_error
from kdabench.qualify.metadata import build_metadata
from kdabench.qualify.parallel import MULTICAST_OFF

SCENARIO = "tensor-parallel"
TOLERANCES = {"output": 5e-3, "state": 3e-3}
SENTINEL = 0.25  # the value of every pool slot no sequence reads (as the qualification's)


@dataclass(frozen=True)
class TpShape:
    """The layer split across ranks: all heads, head dim (K = V), sequence lengths, the
    checkpoint capacity and where the offsets go (kdabench.qualify.metadata modes)."""

    heads: int
    head_dim: int
    lengths: tuple[int, ...]
    capacity: int
    offsets: str = "unaligned"
    seed: int = 0

    def case_id(self, world_size: int) -> str:
        lengths = ".".join(map(str, self.lengths))
        return (f"{SCENARIO}-W{world_size}-H{self.heads}-K{self.head_dim}-C{self.capacity}-"
                f"L{lengths}-{self.offsets}")


def default_shape(world_size: int, device: str) -> TpShape:
    """The CPU shape is small enough for the interpreter; the GPU one is a real layer's."""
    if device == "cpu":
        return TpShape(heads=world_size, head_dim=64, lengths=(5, 19), capacity=2)
    return TpShape(heads=8 * world_size, head_dim=128,
                   lengths=(1, 15, 16, 17, 64, 100, 200, 333, 1000, 2048), capacity=4)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_tensor_parallel(
    world_size: int, backend: str = "nccl", device: str = "cuda", *,
    shape: TpShape | None = None, port: int | None = None,
) -> dict[str, Any]:
    """Run the tensor-parallel case on `world_size` ranks and return rank 0's findings:
    verdict ("pass"/"fail"), message, errors, tolerances, checks (bitwise flags, error
    codes), shape, devices (one identity per rank), wall_s.

    Raises ValueError for a shape the ranks cannot split, RuntimeError when a rank dies
    (torch.multiprocessing's exception names the rank and holds its traceback).
    """
    import torch.multiprocessing as mp

    shape = shape or default_shape(world_size, device)
    if world_size < 1 or shape.heads % world_size:
        raise ValueError(f"{shape.heads} heads do not split evenly over {world_size} ranks")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"{world_size} ranks need {world_size} GPUs; "
                         f"torch sees {torch.cuda.device_count()}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kdabench-tp-") as folder:
        result_path = Path(folder) / "rank0.json"
        mp.spawn(_rank_main, nprocs=world_size, join=True,
                 args=(world_size, backend, device, port or free_port(),
                       dataclasses.asdict(shape), str(result_path)))
        result = json.loads(result_path.read_text())
    result["wall_s"] = round(time.perf_counter() - started, 3)
    return result


# --------------------------------------------------------------------------- one rank


def _rank_main(rank: int, world_size: int, backend: str, device_type: str, port: int,
               shape_fields: dict[str, Any], result_path: str) -> None:
    os.environ.update(MULTICAST_OFF)
    if device_type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before kdabench.kernels is first imported
    import torch.distributed as dist

    shape = TpShape(**{**shape_fields, "lengths": tuple(shape_fields["lengths"])})
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        findings = _rank_work(rank, world_size, device, shape, dist)
        if rank == 0:
            Path(result_path).write_text(json.dumps(findings))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _rank_work(rank: int, world_size: int, device: torch.device, shape: TpShape,
               dist) -> dict[str, Any] | None:
    from kdabench import kernels
    from kdabench.environment import device_identity

    x = make_inputs(list(shape.lengths), shape.heads, shape.head_dim, seed=shape.seed,
                    device=device)
    meta = build_metadata(shape.lengths, shape.capacity, shape.offsets,
                          random.Random(f"{SCENARIO}/{shape.seed}"))
    per_rank = shape.heads // world_size
    heads = slice(rank * per_rank, (rank + 1) * per_rank)
    exported = sorted(meta.write_slots())

    local_pool = _pool(meta, x.initial_state[:, heads], device)
    local_before = local_pool.clone()
    local = _prefill(kernels, x, heads, local_pool, meta, device)
    local_code = local.error_code.to(torch.int32).reshape(1)
    untouched = torch.tensor([int(_unwritten_unchanged(local_pool, local_before, exported))],
                             dtype=torch.int32, device=device)

    outputs = _all_gather(dist, local.o.view(torch.uint8), world_size)
    states = _all_gather(dist, local_pool[exported].contiguous(), world_size)
    codes = _all_gather(dist, local_code, world_size)
    unchanged = _all_gather(dist, untouched, world_size)
    identities: list[Any] = [None] * world_size
    dist.all_gather_object(identities, device_identity(str(device)))
    if rank != 0:
        return None

    gathered_o = torch.cat(outputs, dim=1).view(torch.bfloat16)
    gathered_states = torch.cat(states, dim=1)
    full_pool = _pool(meta, x.initial_state, device)
    before = full_pool.clone()
    whole = _prefill(kernels, x, slice(None), full_pool, meta, device)
    checks = {
        "error_codes": [int(c.item()) for c in codes],
        "one_process_error_code": int(whole.error_code.item()),
        "output_bitwise_equal": bool(torch.equal(gathered_o, whole.o)),
        "states_bitwise_equal": bool(torch.equal(gathered_states, full_pool[exported])),
        "unwritten_slots_unchanged": all(bool(u.item()) for u in unchanged),
        "exported_states": len(exported),
        "heads_per_rank": per_rank,
    }
    failures = []
    if any(checks["error_codes"]) or checks["one_process_error_code"]:
        failures.append(f"valid metadata rejected: codes {checks['error_codes']}, "
                        f"one process {checks['one_process_error_code']}")
    for name in ("output_bitwise_equal", "states_bitwise_equal", "unwritten_slots_unchanged"):
        if not checks[name]:
            failures.append(f"{name} is false")
    errors = _oracle_errors(x, meta, before, gathered_o, gathered_states, exported, device)
    for name, error in errors.items():
        tolerance = TOLERANCES["output" if name == "output" else "state"]
        if not error <= tolerance:
            failures.append(f"{name} error {error:.3e} exceeds tolerance {tolerance:.1e}")
    planned = kernels.plan(_caps(kernels, x, meta, device, per_rank), own_output=False)
    return {
        "verdict": "fail" if failures else "pass",
        "message": "; ".join(failures) or None,
        "world_size": world_size, "dist_backend": dist.get_backend(),
        "device": device.type, "shape": {**dataclasses.asdict(shape), "lengths":
                                         list(shape.lengths), "num_slots": meta.num_slots},
        "errors": errors, "tolerances": dict(TOLERANCES), "checks": checks,
        "devices": identities,
        "kernel_config": dataclasses.asdict(planned.config),
        "config_source": planned.config_source,
    }


def _pool(meta, initial_state: torch.Tensor, device: torch.device) -> torch.Tensor:
    heads, dim = initial_state.shape[1], initial_state.shape[2]
    pool = torch.full((meta.num_slots, heads, dim, dim), SENTINEL, dtype=torch.float32,
                      device=device)
    for n, slot in enumerate(meta.initial):
        if slot >= 0:
            pool[slot] = initial_state[n]
    return pool


def _prefill(kernels, x, heads: slice, pool: torch.Tensor, meta, device: torch.device):
    def part(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[:, heads].contiguous()

    gate = x.gate_kwargs()
    gate["A_log"] = None if x.A_log is None else x.A_log[heads].contiguous()
    gate["dt_bias"] = None if x.dt_bias is None else x.dt_bias[heads].contiguous()
    result = kernels.kda_prefill(part(x.q), part(x.k), part(x.v), part(x.g), part(x.beta),
                                 state_pool=pool, **meta.tensors(device, torch.int32), **gate)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result


def _caps(kernels, x, meta, device: torch.device, heads: int):
    return kernels.Caps(device=device, num_heads=heads, head_dim=x.q.shape[2],
                        max_tokens=x.q.shape[0], max_seqs=len(meta.initial),
                        max_state_slots=meta.num_slots, max_checkpoints=meta.capacity)


def _all_gather(dist, tensor: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def _unwritten_unchanged(pool: torch.Tensor, before: torch.Tensor, written: Sequence[int]) -> bool:
    keep = [slot for slot in range(pool.shape[0]) if slot not in set(written)]
    return bool(torch.equal(pool[keep], before[keep]))


def _oracle_errors(x, meta, before: torch.Tensor, output: torch.Tensor, states: torch.Tensor,
                   exported: list[int], device: torch.device) -> dict[str, float]:
    zeros = torch.zeros_like(x.initial_state[0])
    initial = torch.stack([before[slot] if slot >= 0 else zeros for slot in meta.initial])
    ref = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=meta.cu_seqlens,
                        initial_state=initial, prefix_lengths=meta.actives(), device=device,
                        **x.gate_kwargs())
    row = {slot: i for i, slot in enumerate(exported)}
    errors = {"output": relative_error(ref.o, output)}
    errors["final_state"] = max(relative_error(ref.final_state[n], states[row[slot]])
                                for n, slot in enumerate(meta.final) if slot >= 0)
    checkpoints = [relative_error(ref.prefix_states[n][i], states[row[slot]])
                   for n, i, _, slot in meta.active_entries()]
    if checkpoints:
        errors["checkpoint"] = max(checkpoints)
    return errors


# --------------------------------------------------------------------------- the receipt


def qualify_tensor_parallel(
    world_size: int, *, tier: str, out_dir: str | os.PathLike | None = None,
    shape: TpShape | None = None, command_line: Sequence[str] | None = None,
):
    """Run the case (GPU tier: NCCL, one GPU per rank; CPU tier: gloo under the
    interpreter) and write its receipt; returns a kdabench.qualify.QualifyResult. A rank
    that dies is an "error" case, not an exception."""
    from kdabench.qualify.run import QualifyResult
    from kdabench.receipts import free_receipt_path, new_receipt, receipt_dir

    device = "cuda" if tier == "gpu" else "cpu"
    backend = "nccl" if tier == "gpu" else "gloo"
    shape = shape or default_shape(world_size, device)
    record: dict[str, Any] = {"id": shape.case_id(world_size), "index": 0,
                              "scenario": SCENARIO, "tolerances": dict(TOLERANCES)}
    started = time.perf_counter()
    try:
        result = run_tensor_parallel(world_size, backend, device, shape=shape)
    except Exception as error:  # noqa: BLE001 - a dead rank is a verdict
        devices = [None]
        record.update(verdict="error", message=f"{type(error).__name__}: "
                      f"{str(error).strip().splitlines()[-1] if str(error).strip() else ''}",
                      errors={}, checks={})
    else:
        devices = result.pop("devices")
        record.update({key: result[key] for key in ("verdict", "message", "errors", "checks",
                                                    "kernel_config", "config_source")})
        record["shape"] = result["shape"]
    record.update(median_ms=None, samples_ms=[],
                  wall_s=round(time.perf_counter() - started, 3))
    config = {"tier": tier, "backend": "triton", "scenario": SCENARIO,
              "world_size": world_size, "dist_backend": backend,
              "shape": {**dataclasses.asdict(shape), "lengths": list(shape.lengths)},
              "multicast_off": MULTICAST_OFF, "devices": devices}
    builder = new_receipt("qualify", config=config, command_line=command_line,
                          device=devices[0] if devices[0] else device)
    builder.add_case(record)
    path = free_receipt_path(receipt_dir(out_dir),
                         builder.filename().replace("qualify-", f"qualify-tp{world_size}-", 1),
                         None)
    builder.write(path)
    return QualifyResult(path, builder.document("complete"), builder.cases)
