"""What a CUDA-graph replay of a prefill call rests on, checked on the CPU: the token buckets,
and that a call padded to its bucket (the kernel's metadata ending the sequence at the live
tokens, the last live row picked by index) leaves the residual and every state it writes as
the unpadded call does (the Triton kernel under the interpreter). The replay itself is in
tests/serve/test_engine_gpu.py."""

from __future__ import annotations

import pytest
import torch

from kdabench.serve.call_graphs import MIN_BUCKET, bucket_for, buckets
from kdabench.serve.engine import CallSlots, Engine
from kdabench.serve.model import KdaModel, ModelConfig
from kdabench.serve.settings import CacheSettings, SettingsError

PADDED_TOL = 1e-6  # the live rows' arithmetic is the same; only the matmuls' row count differs


def test_buckets_double_up_to_the_call_limit():
    assert buckets(8192) == [512, 1024, 2048, 4096, 8192]
    assert buckets(6000) == [512, 1024, 2048, 4096, 6000]
    assert buckets(100) == [100]
    assert [bucket_for(n, 8192) for n in (1, 512, 513, 4096, 4097, 8192)] == \
        [MIN_BUCKET, 512, 1024, 4096, 8192, 8192]
    for bad in (0, 8193):
        with pytest.raises(ValueError, match="buckets hold 1 to 8192"):
            bucket_for(bad, 8192)


def test_graphs_need_the_kernel_on_cuda():
    model = KdaModel(ModelConfig(seed=0))
    with pytest.raises(ValueError, match="CUDA graphs need the kernel backend on a CUDA device"):
        Engine(model, "chunk", cuda_graphs=True)
    # unset, they are on only where the engine can capture them
    assert Engine(model, "chunk").describe() == {"backend": "chunk", "cuda_graphs": False}
    assert Engine(model, "chunk", cuda_graphs=False).cuda_graphs is False


def test_the_setting_reads_from_the_environment():
    assert CacheSettings.from_env({}).cuda_graphs is None
    assert CacheSettings.from_env({}).to_dict()["cuda_graphs"] == "auto"
    assert CacheSettings.from_env({"KDABENCH_LOCAL_CUDA_GRAPHS": "1"}).cuda_graphs is True
    assert CacheSettings.from_env({"KDABENCH_LOCAL_CUDA_GRAPHS": "0"}).to_dict()[
        "cuda_graphs"] is False
    with pytest.raises(SettingsError, match="KDABENCH_LOCAL_CUDA_GRAPHS='maybe'"):
        CacheSettings.from_env({"KDABENCH_LOCAL_CUDA_GRAPHS": "maybe"})


@pytest.mark.interpreter
@pytest.mark.parametrize(("live", "bucket"), [(37, 64), (64, 64), (50, 128)])
def test_a_padded_call_writes_what_the_unpadded_one_does(live, bucket):
    model = KdaModel(ModelConfig(seed=0))
    engine = Engine(model, "kernel", max_tokens=128, max_slots=8)
    layers, heads, value_dim, head_dim = model.config.state_shape
    gen = torch.Generator().manual_seed(live)
    initial = torch.randn(layers, heads, value_dim, head_dim, generator=gen)
    slots = CallSlots(0, 1, ((5, 2), (live - 1, 3)))
    meta = torch.tensor(slots.row(live), dtype=torch.int32)
    tokens = torch.randint(0, 256, (bucket,), generator=gen)
    pools, residuals = [], []
    for rows, last in ((live, None), (bucket, torch.tensor([live - 1]))):
        pool = torch.zeros(layers, 8, heads, value_dim, head_dim)
        pool[:, 0] = initial
        pool[:, 4:] = 7.0  # slots no call names: must stay as they are
        residuals.append(engine._run_call(tokens[:rows], pool, slots, meta, last))
        engine._check_errors()
        pools.append(pool)
    unpadded, padded = residuals
    assert padded.shape == unpadded.shape == (1, model.config.d_model)
    scale = unpadded.float().abs().max()
    assert (padded.float() - unpadded.float()).abs().max() <= PADDED_TOL * scale
    for slot in (1, 2, 3):
        assert torch.allclose(pools[1][:, slot], pools[0][:, slot], rtol=0, atol=1e-6), slot
    assert torch.equal(pools[1][:, 4:], pools[0][:, 4:])
    assert torch.equal(pools[1][:, 4:], torch.full_like(pools[1][:, 4:], 7.0))
