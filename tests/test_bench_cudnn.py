"""cuDNN frontend's fused sm90 KDA kernel as a bench peer (kdabench.bench.cudnn): its inputs
checked on any machine; on an sm_90 GPU with the package, its output and final states against
the float64 recurrence, and a CUDA-graph replay against its eager call."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kdabench.bench import cudnn as bench_cudnn
from kdabench.bench.replay import check_replays
from kdabench.bench.timing import capture_graph
from kdabench.inputs import make_inputs
from kdabench.oracles.recurrent import recurrent_kda


def test_inputs_it_cannot_take_are_named():
    x = make_inputs([16], num_heads=1, head_dim=128)
    assert bench_cudnn.input_unsupported(x) is None
    fused = make_inputs([16], num_heads=1, head_dim=128, gate="sigmoid")
    assert "precomputed log decay" in bench_cudnn.input_unsupported(fused)
    small = make_inputs([16], num_heads=1, head_dim=64)
    assert "head_dim 128 only, not 64" in bench_cudnn.input_unsupported(small)
    half = dataclasses.replace(x, q=x.q.half(), k=x.k.half(), v=x.v.half())
    assert "bf16" in bench_cudnn.input_unsupported(half)
    with pytest.raises(ValueError, match="head_dim 128 only"):
        bench_cudnn.cudnn_call(object(), small)


def test_without_a_gpu_or_package_it_says_why():
    host, reason = bench_cudnn.import_cudnn_kda()
    if host is not None:
        pytest.skip("cuDNN's kernel runs here")
    assert reason and "\n" not in reason


@pytest.fixture(scope="module")
def cuda_host():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    host, reason = bench_cudnn.import_cudnn_kda()
    if host is None:
        pytest.skip(reason)
    return host


@pytest.mark.gpu
@pytest.mark.parametrize(("lengths", "heads"), [([300], 2), ([17, 0, 200, 64], 3)])
def test_cudnn_matches_the_float64_recurrence(cuda_host, lengths, heads):
    x = make_inputs(lengths, num_heads=heads, head_dim=128, seed=5, device="cuda")
    o, final = bench_cudnn.cudnn_call(cuda_host, x)()
    torch.cuda.synchronize()
    want = recurrent_kda(x.q, x.k, x.v, x.g, x.beta, cu_seqlens=x.cu_seqlens,
                         initial_state=x.initial_state, lower_bound=x.lower_bound)
    for got, reference in ((o, want.o), (final, want.final_state)):
        error = float((got.double() - reference).norm() / reference.norm())
        assert error < 1e-2, error


@pytest.mark.gpu
def test_cudnn_graph_replays_its_eager_call(cuda_host):
    x = make_inputs([512, 100], num_heads=2, head_dim=128, seed=6, device="cuda")
    call = bench_cudnn.cudnn_call(cuda_host, x)
    graph, written = capture_graph(call)
    check = check_replays([(graph, written)], [call])
    assert check["problem"] is None and check["max_error"] < 1e-6
