"""plan() and bind() refuse what the kernel cannot honour, each with a reason naming the problem;
support_report() says what a plan supports (CPU tier: the interpreter stands in for a GPU)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from kdabench.kernels import Caps, KdaConfigError, bind, plan, support_report

HEADS, DIM, TOKENS, SEQS, SLOTS = 2, 64, 32, 2, 6
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def caps(**changes) -> Caps:
    base = Caps(device=DEVICE, num_heads=HEADS, head_dim=DIM, max_tokens=TOKENS, max_seqs=SEQS,
                max_state_slots=SLOTS, max_checkpoints=2)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("changes, reason", [
    ({"head_dim": 96}, r"head_dim 96 unsupported"),
    ({"max_checkpoints": 3}, r"max_checkpoints 3 unsupported"),
    ({"lower_bound": -6.0}, r"lower_bound -6\.0 outside \[-5\.0, 0\)"),
    ({"lower_bound": 0.0}, r"lower_bound 0\.0 outside"),
    ({"gate": "relu"}, r"gate 'relu' unknown"),
    ({"backend": "tpu"}, r"backend 'tpu' is not available"),
    ({"validation": "host"}, r"validation 'host' unknown"),
    ({"num_heads": 0}, r"num_heads must be >= 1"),
    ({"max_seqs": 0}, r"max_seqs must be >= 1"),
], ids=["head-dim-96", "capacity-3", "lower-bound-minus6", "lower-bound-zero", "gate-relu",
        "backend-tpu", "validation-host", "heads-0", "max-seqs-0"])
def test_plan_refuses_bad_caps_with_the_reason(changes, reason):
    with pytest.raises(KdaConfigError, match=reason):
        plan(caps(**changes))


def test_plan_lists_every_reason_at_once():
    with pytest.raises(KdaConfigError) as caught:
        plan(caps(head_dim=96, max_checkpoints=3, gate="relu"))
    message = str(caught.value)
    for part in ("head_dim 96", "max_checkpoints 3", "gate 'relu'"):
        assert part in message, f"{part!r} missing from {message!r}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU exists")
def test_plan_refuses_cuda_without_a_gpu():
    with pytest.raises(KdaConfigError, match="no CUDA device"):
        plan(caps(device="cuda"))


@pytest.mark.parametrize("capacity", [1, 2, 4], ids=["C1", "C2", "C4"])
def test_plan_accepts_supported_caps(capacity):
    planned = plan(caps(max_checkpoints=capacity, gate="softplus", head_dim=128))
    assert planned.caps.max_checkpoints == capacity
    assert planned.output.shape == (TOKENS, HEADS, 128)
    assert planned.error_code.dtype == torch.int32
    with pytest.raises(dataclasses.FrozenInstanceError):
        planned.caps = caps()  # type: ignore[misc]


def bind_tensors(tokens=TOKENS, heads=HEADS, dim=DIM, capacity=2, device=DEVICE) -> dict:
    """Valid bind() arguments for the plan of caps(); tests break one of them at a time."""
    def zeros(*shape, dtype=torch.bfloat16):
        return torch.zeros(shape, dtype=dtype, device=device)

    ck_shape = (SEQS,) if capacity == 1 else (SEQS, capacity)
    return {
        "q": zeros(tokens, heads, dim), "k": zeros(tokens, heads, dim),
        "v": zeros(tokens, heads, dim), "g": zeros(tokens, heads, dim, dtype=torch.float32),
        "beta": zeros(tokens, heads, dtype=torch.float32),
        "state_pool": zeros(SLOTS, heads, dim, dim, dtype=torch.float32),
        "cu_seqlens": torch.tensor([0, 10, tokens], dtype=torch.int32, device=device),
        "initial_state_indices": torch.tensor([0, 1], dtype=torch.int32, device=device),
        "final_state_indices": torch.tensor([2, 3], dtype=torch.int32, device=device),
        "checkpoint_offsets": torch.ones(ck_shape, dtype=torch.int32, device=device),
        "checkpoint_state_indices": torch.full(ck_shape, -1, dtype=torch.int32, device=device),
    }


def bind_with(planned, **changes):
    arguments = bind_tensors()
    arguments.update(changes)
    arguments = {name: value for name, value in arguments.items() if value is not None}
    positional = [arguments.pop(name) for name in ("q", "k", "v", "g", "beta")]
    return bind(planned, *positional, **arguments)


def test_bind_accepts_valid_tensors():
    binding = bind_with(plan(caps()))
    assert binding.out.shape == (TOKENS, HEADS, DIM)
    assert binding.scale == pytest.approx(DIM**-0.5)
    assert int(binding.num_seqs) == SEQS


def full(shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype, device=DEVICE)


BAD_BINDINGS = [
    ("q-wrong-heads", {"q": full((TOKENS, 3, DIM))},
     r"q has shape \(32, 3, 64\), expected \(32, 2, 64\)"),
    ("k-wrong-dim", {"k": full((TOKENS, HEADS, 128))}, r"k has shape"),
    ("v-int-dtype", {"v": full((TOKENS, HEADS, DIM), torch.int32)}, r"v has dtype torch\.int32"),
    ("q-2d", {"q": full((TOKENS, HEADS * DIM))}, r"q must be \[T, H, K\]"),
    ("too-many-tokens", {name: full((TOKENS + 1, HEADS, DIM)) for name in ("q", "k", "v")},
     r"33 tokens bound, the plan allows 32"),
    ("beta-3d", {"beta": full((TOKENS, HEADS, 1), torch.float32)}, r"beta has shape"),
    ("pool-bf16", {"state_pool": full((SLOTS, HEADS, DIM, DIM))},
     r"state_pool has dtype torch\.bfloat16"),
    ("pool-too-many-slots", {"state_pool": full((SLOTS + 1, HEADS, DIM, DIM), torch.float32)},
     r"state_pool has 7 slots, the plan allows 6"),
    ("pool-wrong-heads", {"state_pool": full((SLOTS, 1, DIM, DIM), torch.float32)},
     r"state_pool has shape"),
    ("pool-3d", {"state_pool": full((SLOTS, HEADS, DIM * DIM), torch.float32)},
     r"state_pool must be \[slots, H, V, K\]"),
    ("cu-seqlens-float", {"cu_seqlens": full((SEQS + 1,), torch.float32)},
     r"cu_seqlens has dtype torch\.float32"),
    ("too-many-sequences", {"cu_seqlens": full((SEQS + 2,), torch.int32)},
     r"3 sequences bound, the plan allows 2"),
    ("initial-wrong-length", {"initial_state_indices": full((SEQS + 1,), torch.int32)},
     r"initial_state_indices has shape \(3,\), expected \(2,\)"),
    ("final-int16", {"final_state_indices": full((SEQS,), torch.int16)},
     r"final_state_indices has dtype torch\.int16"),
    ("checkpoints-vector-for-capacity-2", {"checkpoint_offsets": full((SEQS,), torch.int32)},
     r"checkpoint_offsets has shape \(2,\), expected \(2, 2\)"),
    ("checkpoint-indices-without-offsets", {"checkpoint_offsets": None},
     r"checkpoint_offsets and checkpoint_state_indices go together"),
    ("num-seqs-int64-tensor", {"num_seqs": full((1,), torch.int64)}, r"num_seqs has dtype"),
    ("out-wrong-shape", {"out": full((TOKENS, HEADS, DIM + 1))}, r"out has shape"),
]


@pytest.mark.parametrize("changes, message", [case[1:] for case in BAD_BINDINGS],
                         ids=[case[0] for case in BAD_BINDINGS])
def test_bind_refuses_bad_tensors_with_a_clear_message(changes, message):
    with pytest.raises(KdaConfigError, match=message):
        bind_with(plan(caps()), **changes)


def test_bind_refuses_non_contiguous_q():
    q = full((HEADS, TOKENS, DIM)).transpose(0, 1)
    with pytest.raises(KdaConfigError, match="q must be contiguous"):
        bind_with(plan(caps()), q=q)


def test_bind_refuses_a_tensor_on_another_device():
    pool = torch.zeros(SLOTS, HEADS, DIM, DIM, device="meta")
    with pytest.raises(KdaConfigError, match=r"state_pool is on meta, the plan on"):
        bind_with(plan(caps()), state_pool=pool)


def test_bind_refuses_fused_gate_without_its_parameters():
    with pytest.raises(KdaConfigError, match=r"gate 'sigmoid' needs A_log \[H\] and dt_bias"):
        bind_with(plan(caps(gate="sigmoid")))


def test_bind_refuses_a_missing_output_when_the_plan_owns_none():
    with pytest.raises(KdaConfigError, match="this plan owns no output: pass out="):
        bind_with(plan(caps(), own_output=False))


def test_bind_accepts_vector_checkpoints_for_capacity_1():
    arguments = bind_tensors(capacity=1)
    binding = bind_with(plan(caps(max_checkpoints=1)), **arguments)
    assert binding.checkpoint_offsets.shape == (SEQS,)


SUPPORT_KEYS = {
    "backend", "backends", "device", "eligible", "reasons", "interpreter", "capacities",
    "head_dims", "gate_modes", "index_dtypes", "chunk_size", "min_lower_bound",
    "shared_memory_budget_bytes",
}


def test_support_report_keys_and_values():
    report = support_report()
    assert SUPPORT_KEYS <= set(report), f"missing: {SUPPORT_KEYS - set(report)}"
    assert report["eligible"] is True and report["reasons"] == []
    assert report["backend"] in report["backends"] and "triton" in report["backends"]
    assert report["capacities"] == [1, 2, 4]
    assert report["head_dims"] == [64, 128]
    assert set(report["gate_modes"]) == {"precomputed", "sigmoid", "softplus"}
    assert set(report["index_dtypes"]) == {"int32", "int64"}
    assert report["chunk_size"] == 32
    assert report["min_lower_bound"] == -5.0
    if torch.cuda.is_available():
        assert report["shared_memory_budget_bytes"] <= 99 * 1024
        assert report["shared_memory_per_block_bytes"] >= report["shared_memory_budget_bytes"]
    else:  # the interpreter: no GPU, so no GPU's shared memory to report
        assert report["shared_memory_budget_bytes"] is None
        assert report["shared_memory_per_block_bytes"] is None
    assert report["interpreter"] is (not torch.cuda.is_available())
    json.dumps(report)  # plain data, ready for `kdabench kernels info --json`


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU exists")
def test_support_report_on_a_missing_device_says_why():
    report = support_report("cuda:0")
    assert report["eligible"] is False
    assert any(re.search("CUDA", reason) for reason in report["reasons"]), report["reasons"]


def test_kda_prefill_plans_with_the_config_it_is_given():
    """kda_prefill(config=...) is plan()'s explicit config: one it cannot honour is refused
    with plan()'s reason."""
    from kdabench.inputs import make_inputs
    from kdabench.kernels import KernelConfig, kda_prefill

    x = make_inputs([8], HEADS, DIM, device=DEVICE)
    index = torch.tensor([0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(KdaConfigError, match=r"checkpoints 'pass' runs with 16-token chunks "
                                             r"only \(got chunk_size 64\)"):
        kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=x.initial_state.clone(),
                    cu_seqlens=x.cu_seqlens.to(torch.int32), initial_state_indices=index,
                    final_state_indices=index,
                    config=KernelConfig(chunk_size=64, checkpoints="pass"))
