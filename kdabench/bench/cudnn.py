"""cuDNN frontend's fused sm90 KDA prefill as a peer of `kdabench bench` (``--against cudnn``).

The kernel: nvidia-cudnn-frontend's ``linear_attention/hopper`` CUDA C++ kernel (``kda_fused``,
16-token chunks), compiled by NVRTC on its first use and cached on disk, launched through
``cudnn.linear_attention.hopper.cuda_host.launch`` with device addresses: no allocation and no
host sync per call, so a CUDA graph captures it. Each sequence is split into pieces to fill
the GPU; a piece after the first starts from a zero state after a warm-up walk back over
earlier tokens, which stops once the gates have decayed the entering state under 2^-20 (where
they have not, the walk reaches the sequence's start and the result is exact). Its speed
therefore hangs on the gates: the bench runs it under every gate regime it draws.

Inputs as fla's and kdabench's (same tensors where the layouts agree): q, k, v bf16
[T, H, 128]; g fp32 log decay [T, H, 128] (precomputed, at or above the lower bound); beta
fp32 [T, H] in (0, 1); cu_seqlens int32 [N + 1]; initial and final states fp32
[N, H, V, K] (V-first, as kdabench's pool); scale K^-0.5; q and k already L2-normalised
(``qk_l2norm`` inputs set the kernel's in-kernel normalisation flag instead).

Needs an sm_90 GPU and the optional extra ``kdabench[cudnn]``: nvidia-cudnn-frontend (1.32.0
measured), cuda-bindings, NVRTC (torch's CUDA 13 build brings it) and the CUDA runtime and
crt headers (nvidia-cuda-runtime, nvidia-cuda-crt) in one include folder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kdabench.bench.backend import import_failure
from kdabench.inputs import KdaInputs

HEAD_DIM = 128
SM90 = (9, 0)
PACKAGE = "nvidia-cudnn-frontend"


def import_cudnn_kda() -> tuple[Any | None, str | None]:
    """cuDNN frontend's sm90 launch module, or None and why it cannot run here: no sm_90
    GPU, the package absent or broken, or its kernel failing to compile or run on a
    16-token probe (missing headers or NVRTC show up there)."""
    if not torch.cuda.is_available():
        return None, "cuDNN's KDA kernel needs a CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability != SM90:
        return None, (f"cuDNN frontend's fused KDA kernel is built for sm_90; this GPU is "
                      f"sm_{capability[0]}{capability[1]}")
    try:
        from cudnn.linear_attention.hopper import cuda_host
    except Exception as error:  # noqa: BLE001 - a missing or broken install is a reason
        return None, import_failure(PACKAGE, error, "kdabench[cudnn]",
                                    "to compare against cuDNN's KDA kernel")
    try:
        _probe(cuda_host)
    except Exception as error:  # noqa: BLE001 - a kernel that cannot build is a reason
        return None, (f"cuDNN's KDA kernel does not build or run here: "
                      f"{type(error).__name__}: {str(error)[:300]}")
    return cuda_host, None


def input_unsupported(x: KdaInputs) -> str | None:
    """Why cuDNN's kernel cannot take ``x`` (None when it can)."""
    if x.gate != "precomputed":
        return f"cuDNN's KDA kernel takes precomputed log decay, not gate={x.gate!r}"
    if x.q.shape[-1] != HEAD_DIM or x.v.shape[-1] != HEAD_DIM:
        return f"cuDNN's KDA kernel takes head_dim {HEAD_DIM} only, not {x.q.shape[-1]}"
    if x.q.dtype != torch.bfloat16:
        return f"cuDNN's KDA kernel takes bf16 q, k, v, not {x.q.dtype}"
    return None


def cudnn_call(cuda_host: Any, x: KdaInputs, scale: float | None = None
               ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A closure launching cuDNN's kernel on ``x`` on the current stream, returning its
    output [T, H, V] and final states [N, H, V, K] (the same tensors every call). Inputs are
    converted once, here; the call itself only launches."""
    reason = input_unsupported(x)
    if reason:
        raise ValueError(reason)
    tokens, heads, dim = x.q.shape
    seqs = x.cu_seqlens.numel() - 1
    device = x.q.device
    q, k, v = (t.contiguous() for t in (x.q, x.k, x.v))
    g = x.g.float().contiguous()
    beta = x.beta.float().contiguous()
    cu_seqlens = x.cu_seqlens.to(torch.int32).contiguous()
    initial = (x.initial_state.float().contiguous() if x.initial_state is not None else
               torch.zeros(seqs, heads, dim, dim, dtype=torch.float32, device=device))
    o = torch.empty(tokens, heads, dim, dtype=torch.bfloat16, device=device)
    final = torch.empty(seqs, heads, dim, dim, dtype=torch.float32, device=device)
    flags = (cuda_host.FLAG_L2NORM if x.qk_l2norm else 0) | \
        (cuda_host.FLAG_BETA_SIGMOID if x.beta_sigmoid else 0)
    q_scale = float(dim ** -0.5 if scale is None else scale)
    index = device.index if device.index is not None else torch.cuda.current_device()

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        cuda_host.launch(
            device=index, stream=torch.cuda.current_stream(device).cuda_stream,
            q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(),
            beta=beta.data_ptr(), cu_seqlens=cu_seqlens.data_ptr(),
            initial_state=initial.data_ptr(), o=o.data_ptr(), final_state=final.data_ptr(),
            total_tokens=tokens, n_seqs=seqs, n_heads=heads,
            gate_lower_bound=float(x.lower_bound), flags=flags, q_scale=q_scale)
        return o, final
    return call


def _probe(cuda_host: Any) -> None:
    """One 16-token, one-head call (compiles the kernel on first use); raises when it cannot
    build or launch."""
    from kdabench.inputs import make_inputs

    x = make_inputs([16], num_heads=1, head_dim=HEAD_DIM, seed=0, device="cuda")
    cudnn_call(cuda_host, x)()
    torch.cuda.synchronize()
