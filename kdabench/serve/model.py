"""The embedded reference server's model: a seeded, randomly initialised KDA language model.

Byte-level tokens (a token is one UTF-8 byte, vocabulary 256). Each of the `num_layers` layers is

    h = RMSNorm(x);  q, k, v = h W_q, h W_k, h W_v   ([T, H, K] each, bf16: the kernel contract)
    raw gate = h W_g (or h W_g_down W_g_up, low rank);  beta logits = h W_beta  ([T, H])
    o = KDA(q, k, v, raw gate, beta; gate="sigmoid", qk_l2norm, beta_sigmoid)   -> [T, H, V]
    x = x + o W_o;  x = x + W_down silu(RMSNorm(x) W_up)   (the MLP only where mlp_hidden > 0)

then a final RMSNorm and an LM head tied to the embedding. The KDA recurrence itself is not
here: `kdabench.serve.engine` runs it (the Triton kernel on CUDA, the chunk path on the CPU,
a token-by-token recurrence for decode); this module only owns the weights and the per-token
maps around it, so every path shares them.

Presets (`PRESETS`, `serve-local --model`):

* "tiny": 2 layers, 2 heads of 64, d_model 128, an MLP, fp32 weights and residual stream: the
  CPU default, fast enough for tests. Its weights are drawn on the CPU, so the same seed gives
  the same model, bit for bit, on any machine.
* "kimi-linear-tpN": the KDA layers of Kimi Linear (moonshotai/Kimi-Linear-48B-A3B-Instruct) as
  one GPU of an N-way tensor-parallel deployment holds them. Its config.json (read from a copy
  of it published with a quantisation of the model, hf.co/Firworks/Kimi-Linear-48B-A3B-Instruct-
  nvfp4): hidden_size 2304, num_hidden_layers 27, linear_attn_config {num_heads 32, head_dim
  128, kda_layers 1-3, 5-7, ..., 25-26 (20 layers), full_attn_layers 4, 8, ..., 24, 27 (MLA)},
  vocab_size 163840. The presets keep only the 20 KDA layers, the state-carrying ones a prefix
  cache of recurrent states is about: no MLA layers, no MoE feed-forward, no short
  convolution or output gate, and byte tokens. Per GPU: 32 / N heads of 128, q/k/v/o
  projections 2304 x (32 / N * 128), the forget gate low rank (2304 x 128 x heads * 128) as in
  Kimi Linear's f_proj, bf16 weights and residual stream, fp32 states. Weights are drawn on
  the model's device (seeded; the same device kind gives the same model).

The gate is `lower_bound * sigmoid(exp(A_log) * (raw + dt_bias))`; dt_bias is drawn well below
zero so most channels decay slowly (log decay ~ -0.01 .. -0.6 per token) and the recurrent state
carries information across thousands of tokens: what a prefix cache has to get right.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

MODEL_ID = "kdabench-local-kda"
KDA_ACTIVATION_DTYPE = torch.bfloat16  # q, k, v as the kernel contract takes them
LOGIT_SCALE = 0.5
PRINTABLE_BIAS = 5.0  # logit bonus of the printable ASCII bytes 32..126
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference model; head_dim is both K and V."""

    preset: str = "tiny"
    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 64
    mlp_hidden: int = 256  # 0: no MLP (KDA layers only)
    gate_rank: int = 0  # 0: a full-rank gate projection; r: D x r x H*K
    dtype: str = "float32"  # weights and residual stream
    lower_bound: float = -5.0
    rms_eps: float = 1e-6
    seed: int = 0

    @property
    def revision(self) -> str:
        return f"{self.preset}-seed-{self.seed}"

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """Recurrent state of the whole model: [layers, H, V, K] fp32 (pool layout, V-first)."""
        return (self.num_layers, self.num_heads, self.head_dim, self.head_dim)

    @property
    def state_bytes(self) -> int:
        return math.prod(self.state_shape) * 4

    @property
    def parameters(self) -> int:
        D, HK, H, F, r = self.d_model, self.num_heads * self.head_dim, self.num_heads, \
            self.mlp_hidden, self.gate_rank
        gate = D * r + r * HK if r else D * HK
        per_layer = 4 * D * HK + gate + D * H + H + HK + 2 * D + 2 * D * F
        return self.vocab_size * D + self.num_layers * per_layer + D

    def describe(self) -> dict[str, Any]:
        """The preset and its geometry, as /version reports it."""
        return {**asdict(self), "state_bytes": self.state_bytes, "parameters": self.parameters}


def _kimi_linear(tp: int) -> ModelConfig:
    return ModelConfig(
        preset=f"kimi-linear-tp{tp}", d_model=2304, num_layers=20, num_heads=32 // tp,
        head_dim=128, mlp_hidden=0, gate_rank=128, dtype="bfloat16",
    )  # fmt: skip


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(),
    **{f"kimi-linear-tp{tp}": _kimi_linear(tp) for tp in (1, 2, 4, 8)},
}


def preset_config(name: str, seed: int = 0) -> ModelConfig:
    """The preset `name` with weights seeded by `seed`; ValueError naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; expected one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], seed=seed)


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights; projections are [in, out] so that y = x @ w."""

    attn_norm: torch.Tensor  # [D]
    w_q: torch.Tensor  # [D, H*K]
    w_k: torch.Tensor  # [D, H*K]
    w_v: torch.Tensor  # [D, H*V]
    w_gate: tuple[torch.Tensor, ...]  # ([D, H*K],) or low rank ([D, r], [r, H*K]): raw gate
    w_beta: torch.Tensor  # [D, H], beta logits
    A_log: torch.Tensor  # [H] fp32
    dt_bias: torch.Tensor  # [H, K] fp32
    w_o: torch.Tensor  # [H*V, D]
    mlp_norm: torch.Tensor  # [D]
    w_up: torch.Tensor | None  # [D, F]
    w_down: torch.Tensor | None  # [F, D]


@dataclass(frozen=True)
class KdaInputs:
    """What one layer hands the KDA recurrence for T tokens (the kernel's raw-gate contract)."""

    q: torch.Tensor  # [T, H, K] bf16
    k: torch.Tensor  # [T, H, K] bf16
    v: torch.Tensor  # [T, H, V] bf16
    raw_gate: torch.Tensor  # [T, H, K] (the model's dtype)
    beta_logits: torch.Tensor  # [T, H] (the model's dtype)
    A_log: torch.Tensor  # [H] fp32
    dt_bias: torch.Tensor  # [H, K] fp32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in fp32, returned in x's dtype."""
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


SMALL_MODEL_PARAMETERS = 64 << 20  # models up to this size draw their weights on the CPU


class KdaModel:
    """Seeded random weights plus the per-token maps around the KDA recurrence."""

    def __init__(self, config: ModelConfig | None = None, device: str | torch.device = "cpu"):
        self.config = config = config or ModelConfig()
        self.device = torch.device(device)
        self.dtype = config.torch_dtype
        draw_on = "cpu" if config.parameters <= SMALL_MODEL_PARAMETERS else self.device
        gen = torch.Generator(device=draw_on).manual_seed(config.seed)
        D, H, K, F = config.d_model, config.num_heads, config.head_dim, config.mlp_hidden

        def draw(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, device=draw_on)

        def normal(*shape: int, std: float, dtype: torch.dtype | None = None) -> torch.Tensor:
            return (draw(*shape) * std).to(self.device, dtype or self.dtype)

        def uniform(*shape: int, low: float, high: float) -> torch.Tensor:
            values = torch.rand(*shape, generator=gen, device=draw_on)
            return (low + (high - low) * values).to(self.device)

        def gate() -> tuple[torch.Tensor, ...]:
            if not config.gate_rank:
                return (normal(D, H * K, std=0.5 * D**-0.5),)
            r = config.gate_rank
            return normal(D, r, std=D**-0.5), normal(r, H * K, std=0.5 * r**-0.5)

        self.embedding = normal(config.vocab_size, D, std=1.0)  # [vocab, D], tied LM head
        ones = torch.ones(D, device=self.device, dtype=self.dtype)
        blocks = 2 * config.num_layers if F else config.num_layers
        residual_std = 2.0 * blocks**-0.5
        self.layers = [
            LayerWeights(
                attn_norm=ones.clone(),
                w_q=normal(D, H * K, std=D**-0.5),
                w_k=normal(D, H * K, std=D**-0.5),
                w_v=normal(D, H * K, std=D**-0.5),
                w_gate=gate(),
                w_beta=normal(D, H, std=D**-0.5),
                A_log=torch.zeros(H, device=self.device),
                dt_bias=uniform(H, K, low=-6.0, high=-2.0),
                w_o=normal(H * K, D, std=residual_std * (H * K) ** -0.5),
                mlp_norm=ones.clone(),
                w_up=normal(D, F, std=D**-0.5) if F else None,
                w_down=normal(F, D, std=residual_std * F**-0.5) if F else None,
            )
            for _ in range(config.num_layers)
        ]
        self.final_norm = ones.clone()
        self.head_order = torch.randperm(config.vocab_size, generator=gen, device=draw_on).to(
            self.device
        )
        printable = torch.zeros(config.vocab_size)
        printable[32:127] = PRINTABLE_BIAS
        self.printable_bias = printable.to(self.device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int64 [T] -> residual stream [T, D] in the model's dtype."""
        return self.embedding[tokens.to(self.device)]

    def kda_inputs(self, layer: int, x: torch.Tensor) -> KdaInputs:
        """Layer `layer`'s projections of the residual stream x [T, D]."""
        w, cfg = self.layers[layer], self.config
        h = rms_norm(x, w.attn_norm, cfg.rms_eps)
        T, H, K = x.shape[0], cfg.num_heads, cfg.head_dim

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(T, H, K)

        gate = h
        for matrix in w.w_gate:
            gate = gate @ matrix
        return KdaInputs(
            q=heads(h @ w.w_q).to(KDA_ACTIVATION_DTYPE).contiguous(),
            k=heads(h @ w.w_k).to(KDA_ACTIVATION_DTYPE).contiguous(),
            v=heads(h @ w.w_v).to(KDA_ACTIVATION_DTYPE).contiguous(),
            raw_gate=heads(gate).contiguous(),
            beta_logits=(h @ w.w_beta).contiguous(),
            A_log=w.A_log,
            dt_bias=w.dt_bias,
        )

    def finish_layer(self, layer: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual stream after layer `layer`, given its KDA output o [T, H, V] (any float dtype)."""
        w, cfg = self.layers[layer], self.config
        x = x + o.to(self.dtype).reshape(x.shape[0], -1) @ w.w_o
        if w.w_up is None or w.w_down is None:
            return x
        h = rms_norm(x, w.mlp_norm, cfg.rms_eps)
        return x + torch.nn.functional.silu(h @ w.w_up) @ w.w_down

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits fp32 [T, vocab] from the residual stream x [T, D].

        The head shares the embedding's parameters but reads its rows in a seeded permuted
        order (`head_order`): with the plain tied head a random model's greedy answer is its
        last input byte, repeated. It is scaled by LOGIT_SCALE / sqrt(D) so the next-token
        distribution is spread rather than one-hot, and printable ASCII gets a fixed bias so
        answers are mostly readable text.
        """
        h = rms_norm(x, self.final_norm, self.config.rms_eps).float()
        scale = LOGIT_SCALE * self.config.d_model**-0.5
        return (h @ self.embedding[self.head_order].float().T) * scale + self.printable_bias
