"""The reference model's prefill paths, decode and checkpoint states (CPU tier).

The chunk path (the CPU default) is checked against the chunk mirror, checkpoints against the
final state of a separate prefill over the prefix, decode against a prefill one token longer,
and the Triton kernel (under the interpreter on a CPU) against the chunk path.
"""

from __future__ import annotations

import pytest
import torch

from kdabench.oracles import assert_close, chunk_kda_mirror, prepare_inputs
from kdabench.serve.engine import Engine, chunk_kda_cpu
from kdabench.serve.model import KdaModel, ModelConfig
from kdabench.serve.retention import PrefillCall, plan_prefill_calls

MIRROR_TOL = 1e-5  # fp32 against fp32, same chunking: ~5e-6 measured
DECODE_TOL = 1e-4  # the token recurrence against the chunked prefill, fp32: ~2e-7 measured
KERNEL_TOL = 3e-3  # the kernel's bf16 output against the fp32 chunk path: ~5e-4 measured


@pytest.fixture(scope="module")
def model() -> KdaModel:
    return KdaModel(ModelConfig(seed=0))


@pytest.fixture(scope="module")
def engine(model: KdaModel) -> Engine:
    return Engine(model)


def tokens(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


SPANS = [  # (tokens, checkpoint offsets, resume from a state?)
    (1, [], False),
    (15, [1, 7], False),
    (16, [16], True),
    (100, [1, 16, 17, 50, 99], True),
    (257, [128, 256], False),
]


@pytest.mark.parametrize(
    ("num_tokens", "offsets", "resume"), SPANS,
    ids=[f"T{t}-ck{len(o)}-{'resume' if r else 'cold'}" for t, o, r in SPANS],
)  # fmt: skip
def test_chunk_path_matches_mirror(model, num_tokens, offsets, resume):
    x = model.kda_inputs(0, model.embed(tokens(num_tokens, seed=num_tokens)))
    initial = (
        torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(1)) if resume else None
    )
    common = {"gate": "sigmoid", "lower_bound": -5.0, "A_log": x.A_log, "dt_bias": x.dt_bias,
              "qk_l2norm": True, "beta_sigmoid": True}  # fmt: skip
    ref = chunk_kda_mirror(x.q, x.k, x.v, x.raw_gate, x.beta_logits, initial_state=initial,
                           checkpoint_offsets=[offsets], **common)  # fmt: skip
    p = prepare_inputs(x.q, x.k, x.v, x.raw_gate, x.beta_logits, initial_state=initial,
                       dtype=torch.float32, **common)  # fmt: skip
    o, final, checkpoints = chunk_kda_cpu(p.q, p.k, p.v, p.g, p.beta, p.initial_state[0], p.scale,
                                          offsets)  # fmt: skip
    assert_close("o", ref.o, o, MIRROR_TOL)
    assert_close("final_state", ref.final_state[0], final, MIRROR_TOL)
    if offsets:
        assert_close("checkpoints", ref.checkpoint_states[0], checkpoints, MIRROR_TOL)


@pytest.mark.parametrize("backend", ["chunk", "mirror"])
def test_checkpoints_equal_prefix_final_states(model, backend):
    engine = Engine(model, backend)
    seq = tokens(300, seed=2)
    offsets = [1, 64, 100, 299]
    result = engine.prefill(seq, None, offsets)
    for i, offset in enumerate(offsets):
        prefix = engine.prefill(seq[:offset])
        assert_close(f"checkpoint@{offset}", prefix.final_state, result.checkpoint_states[i], 1e-5)


def test_resume_from_checkpoint_gives_cold_logits(engine):
    seq = tokens(500, seed=3)
    cold = engine.prefill(seq, None, [256])
    resumed = engine.prefill(seq[256:], cold.checkpoint_states[0])
    assert_close("logits", cold.logits, resumed.logits, 1e-5)
    assert_close("final_state", cold.final_state, resumed.final_state, 1e-5)


@pytest.mark.parametrize("n", [1, 37, 256])
def test_decode_step_matches_longer_prefill(engine, n):
    seq = tokens(n + 1, seed=n)
    prefilled = engine.prefill(seq[:n])
    logits, state = engine.decode_step(prefilled.final_state, int(seq[n]))
    longer = engine.prefill(seq)
    assert_close("logits", longer.logits, logits, DECODE_TOL)
    assert_close("state", longer.final_state, state, DECODE_TOL)


def test_kernel_backend_matches_chunk_path(model):
    kernel, chunk = Engine(model, "kernel"), Engine(model, "chunk")
    seq = tokens(40, seed=4)
    initial = chunk.prefill(seq[:10]).final_state
    ref = chunk.prefill(seq[10:], initial, [5, 16, 17, 29])
    out = kernel.prefill(seq[10:], initial, [5, 16, 17, 29])
    assert_close("logits", ref.logits, out.logits, KERNEL_TOL)
    assert_close("final_state", ref.final_state, out.final_state, KERNEL_TOL)
    assert_close("checkpoints", ref.checkpoint_states, out.checkpoint_states, KERNEL_TOL)


def test_same_seed_same_model_other_seed_other_model():
    a, b, c = (KdaModel(ModelConfig(seed=s)) for s in (0, 0, 1))
    assert torch.equal(a.embedding, b.embedding) and torch.equal(a.layers[1].w_o, b.layers[1].w_o)
    assert not torch.equal(a.embedding, c.embedding)


CALLS = [  # (start, stop, max batched tokens, export) -> calls; blocks of 1024, capacity 4
    (0, 8192, 8192, True, [PrefillCall(0, 8192, (2048, 4096, 6144, 7168))]),
    (0, 8192, 8192, False, [PrefillCall(0, 8192)]),
    (0, 20000, 8192, False, [PrefillCall(0, 8192), PrefillCall(8192, 16384),
                              PrefillCall(16384, 20000)]),
    (0, 16384, 8192, True, [PrefillCall(0, 8192, (2048, 4096, 6144), keep_end=True),
                            PrefillCall(8192, 16384, (10240, 12288, 14336, 15360))]),
    (4096, 8192, 8192, True, [PrefillCall(4096, 8192, (6144, 7168))]),
    (0, 1024, 8192, True, [PrefillCall(0, 1024)]),
    (0, 1025, 8192, True, [PrefillCall(0, 1025, (1024,))]),
    (100, 1000, 8192, True, [PrefillCall(100, 1000)]),
    (0, 8193, 4096, True, [PrefillCall(0, 4096, (1024, 2048, 3072), keep_end=True),
                           PrefillCall(4096, 8192, (5120, 6144, 7168), keep_end=True),
                           PrefillCall(8192, 8193)]),
    (1500, 12000, 8192, True, [PrefillCall(1500, 9692, (2048, 4096, 6144, 8192)),
                               PrefillCall(9692, 12000, (10240, 11264))]),
]


@pytest.mark.parametrize(
    ("start", "stop", "batched", "export", "expected"), CALLS,
    ids=[f"{a}-{b}-by{m}-export_{'on' if e else 'off'}" for a, b, m, e, _ in CALLS],
)  # fmt: skip
def test_plan_prefill_calls(start, stop, batched, export, expected):
    calls = plan_prefill_calls(start, stop, block_tokens=1024, max_batched_tokens=batched,
                               checkpoint_export=export)  # fmt: skip
    assert calls == expected
    assert all(c.stop - c.start <= batched for c in calls)
    assert all(len(c.retained) <= 4 for c in calls)
    retained = [p for c in calls for p in c.retained]
    assert all(p % 1024 == 0 and start < p < stop for p in retained)
    last_boundary = (stop - 1) // 1024 * 1024
    if export and last_boundary > start:
        assert retained[-1] == last_boundary  # always kept
    if not export:
        assert not retained


def test_long_shared_prefix_resumes_at_a_retained_boundary():
    """The 57,344-of-65,536 case: P1's calls keep its 57,344 state (a call's end)."""
    calls = plan_prefill_calls(0, 65536, block_tokens=1024, max_batched_tokens=8192,
                               checkpoint_export=True)  # fmt: skip
    retained = [p for c in calls for p in c.retained]
    assert len(calls) == 8 and 57344 in retained and 4096 in retained
    assert len(retained) == 32 and retained[-1] == 64512
