"""The embedded reference server's model: a small, seeded, randomly initialised KDA language model.

Byte-level tokens (a token is one UTF-8 byte, vocabulary 256). Each of the `num_layers` layers is

    h = RMSNorm(x);  q, k, v = h W_q, h W_k, h W_v   ([T, H, K] each, cast to bf16: the kernel
    contract);  raw gate = h W_g  ([T, H, K] fp32);  beta logits = h W_beta  ([T, H] fp32)
    o = KDA(q, k, v, raw gate, beta; gate="sigmoid", qk_l2norm, beta_sigmoid)   -> [T, H, V]
    x = x + o W_o;  x = x + W_down silu(RMSNorm(x) W_up)

then a final RMSNorm and an LM head tied to the embedding. The KDA recurrence itself is not
here: `kdabench.serve.engine` runs it (the Triton kernel on CUDA, the chunk mirror on the CPU,
a token-by-token recurrence for decode); this module only owns the weights and the per-token
maps around it, so every path shares them. Weights are fp32, drawn from a torch.Generator seeded
with `seed`: the same seed gives the same model, bit for bit, on any machine.

The gate is `lower_bound * sigmoid(exp(A_log) * (raw + dt_bias))`; dt_bias is drawn well below
zero so most channels decay slowly (log decay ~ -0.01 .. -0.6 per token) and the recurrent state
carries information across thousands of tokens: what a prefix cache has to get right.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODEL_ID = "kdabench-local-kda"
KDA_ACTIVATION_DTYPE = torch.bfloat16  # q, k, v as the kernel contract takes them
LOGIT_SCALE = 0.5
PRINTABLE_BIAS = 5.0  # logit bonus of the printable ASCII bytes 32..126


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the reference model; head_dim is both K and V."""

    vocab_size: int = 256
    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 64
    mlp_hidden: int = 256
    lower_bound: float = -5.0
    rms_eps: float = 1e-6
    seed: int = 0

    @property
    def revision(self) -> str:
        return f"seed-{self.seed}"

    @property
    def state_shape(self) -> tuple[int, int, int, int]:
        """Recurrent state of the whole model: [layers, H, V, K] fp32 (pool layout, V-first)."""
        return (self.num_layers, self.num_heads, self.head_dim, self.head_dim)


@dataclass(frozen=True)
class LayerWeights:
    """One layer's fp32 weights; projections are [in, out] so that y = x @ w."""

    attn_norm: torch.Tensor  # [D]
    w_q: torch.Tensor  # [D, H*K]
    w_k: torch.Tensor  # [D, H*K]
    w_v: torch.Tensor  # [D, H*V]
    w_gate: torch.Tensor  # [D, H*K], raw gate
    w_beta: torch.Tensor  # [D, H], beta logits
    A_log: torch.Tensor  # [H]
    dt_bias: torch.Tensor  # [H, K]
    w_o: torch.Tensor  # [H*V, D]
    mlp_norm: torch.Tensor  # [D]
    w_up: torch.Tensor  # [D, F]
    w_down: torch.Tensor  # [F, D]


@dataclass(frozen=True)
class KdaInputs:
    """What one layer hands the KDA recurrence for T tokens (the kernel's raw-gate contract)."""

    q: torch.Tensor  # [T, H, K] bf16
    k: torch.Tensor  # [T, H, K] bf16
    v: torch.Tensor  # [T, H, V] bf16
    raw_gate: torch.Tensor  # [T, H, K] fp32
    beta_logits: torch.Tensor  # [T, H] fp32
    A_log: torch.Tensor  # [H] fp32
    dt_bias: torch.Tensor  # [H, K] fp32


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


class KdaModel:
    """Seeded random weights plus the per-token maps around the KDA recurrence."""

    def __init__(self, config: ModelConfig | None = None, device: str | torch.device = "cpu"):
        self.config = config = config or ModelConfig()
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(config.seed)
        D, H, K, F = config.d_model, config.num_heads, config.head_dim, config.mlp_hidden

        def normal(*shape: int, std: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * std).to(self.device)

        def uniform(*shape: int, low: float, high: float) -> torch.Tensor:
            return (low + (high - low) * torch.rand(*shape, generator=gen)).to(self.device)

        self.embedding = normal(config.vocab_size, D, std=1.0)  # [vocab, D], tied LM head
        ones = torch.ones(D, device=self.device)
        residual_std = 2.0 * (2 * config.num_layers) ** -0.5
        self.layers = [
            LayerWeights(
                attn_norm=ones.clone(),
                w_q=normal(D, H * K, std=D**-0.5),
                w_k=normal(D, H * K, std=D**-0.5),
                w_v=normal(D, H * K, std=D**-0.5),
                w_gate=normal(D, H * K, std=0.5 * D**-0.5),
                w_beta=normal(D, H, std=D**-0.5),
                A_log=torch.zeros(H, device=self.device),
                dt_bias=uniform(H, K, low=-6.0, high=-2.0),
                w_o=normal(H * K, D, std=residual_std * (H * K) ** -0.5),
                mlp_norm=ones.clone(),
                w_up=normal(D, F, std=D**-0.5),
                w_down=normal(F, D, std=residual_std * F**-0.5),
            )
            for _ in range(config.num_layers)
        ]
        self.final_norm = ones.clone()
        self.head_order = torch.randperm(config.vocab_size, generator=gen).to(self.device)
        printable = torch.zeros(config.vocab_size)
        printable[32:127] = PRINTABLE_BIAS
        self.printable_bias = printable.to(self.device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens int64 [T] -> residual stream fp32 [T, D]."""
        return self.embedding[tokens.to(self.device)]

    def kda_inputs(self, layer: int, x: torch.Tensor) -> KdaInputs:
        """Layer `layer`'s projections of the residual stream x [T, D]."""
        w, cfg = self.layers[layer], self.config
        h = rms_norm(x, w.attn_norm, cfg.rms_eps)
        T, H, K = x.shape[0], cfg.num_heads, cfg.head_dim

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.reshape(T, H, K)

        return KdaInputs(
            q=heads(h @ w.w_q).to(KDA_ACTIVATION_DTYPE).contiguous(),
            k=heads(h @ w.w_k).to(KDA_ACTIVATION_DTYPE).contiguous(),
            v=heads(h @ w.w_v).to(KDA_ACTIVATION_DTYPE).contiguous(),
            raw_gate=heads(h @ w.w_gate).contiguous(),
            beta_logits=(h @ w.w_beta).contiguous(),
            A_log=w.A_log,
            dt_bias=w.dt_bias,
        )

    def finish_layer(self, layer: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual stream after layer `layer`, given its KDA output o [T, H, V] (any float dtype)."""
        w, cfg = self.layers[layer], self.config
        x = x + o.float().reshape(x.shape[0], -1) @ w.w_o
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
        h = rms_norm(x, self.final_norm, self.config.rms_eps)
        scale = LOGIT_SCALE * self.config.d_model**-0.5
        return (h @ self.embedding[self.head_order].T) * scale + self.printable_bias
