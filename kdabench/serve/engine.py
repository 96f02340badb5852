"""Prefill (with checkpoint export into the prefix cache) and greedy decode for the reference model.

Prefill backends, one math (section 2 of DESIGN.md, gate="sigmoid", qk_l2norm, beta_sigmoid):

* "kernel": `kdabench.kernels.kda_prefill` (the default on CUDA). Each layer's call gets a
  small state pool [2 + 4, H, V, K]: slot 0 the initial state, slot 1 the final state, slots
  2..5 the checkpoints (capacity 4, inactive entries -1).
* "chunk": `chunk_kda_cpu` below, the default on the CPU: the chunk mirror's algorithm with
  every chunk's intra-chunk work batched at once (heads x chunks), leaving only the state
  hand-off between chunks as a Python loop; checked against the mirror in the tests.
* "mirror": `kdabench.oracles.chunk_kda_mirror`, the readable chunked algorithm in plain
  torch fp32, one chunk at a time (slower; the reference the "chunk" path is tested against).

Decode runs one token at a time through a small fp32 recurrence in the pool layout
(S [H, V, K]):  S = S * exp(g);  S += beta (v - S k) k^T;  o = scale S q.

`PromptPrefill` ties it to the prefix cache: resume from the longest cached prefix, then split
the rest into kernel calls that each export up to 4 block-boundary checkpoints and end at the
next boundary (or at the prompt's end), so every block boundary's state lands in the cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from kdabench.oracles import chunk_kda_mirror, l2_normalize, log_decay, prepare_inputs

from .model import KdaInputs, KdaModel
from .prefix_cache import CacheSettings, PrefixCache

CHECKPOINT_CAPACITY = 4  # checkpoints one kernel call exports (the kernel's largest capacity)
BACKENDS = ("kernel", "chunk", "mirror")
CHUNK_SIZE = 16  # as the mirror: chunk * |lower_bound| must stay under ~88 (exp(-G) in fp32)


def chunk_kda_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    scale: float,
    checkpoint_offsets: Sequence[int] = (),
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked KDA over one sequence, all chunks' intra-chunk work batched (fp32, any device).

    Inputs already transformed (as `prepare_inputs` leaves them): q, k, g [T, H, K] (l2-normed
    q, k; g the log decay), v [T, H, V], beta [T, H] post-sigmoid, initial_state [H, V, K].
    Same derivation as `kdabench.oracles.chunk_mirror`, rearranged so that only the state
    hand-off depends on the previous chunk: with Tinv = (I + M)^-1 per chunk,
    delta = U - W S0 where U = Tinv (beta v) and W = Tinv (beta kg) need no state.
    Returns (o [T, H, V], final state [H, V, K], checkpoint states [C, H, V, K]); each
    checkpoint offset p in 0..T is the state after the first p tokens.
    """
    num_tokens, num_heads, head_dim = q.shape
    value_dim = v.shape[-1]
    num_chunks = -(-num_tokens // chunk_size)
    padding = num_chunks * chunk_size - num_tokens

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [T, H, ...] -> [H, NC, C, ...], zero-padded
        t = torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, 0, 0, padding))
        return t.reshape(num_chunks, chunk_size, num_heads, *t.shape[2:]).movedim(2, 0)

    qc, kc, vc, gc, bc = (chunked(t.float()) for t in (q, k, v, g, beta))
    G = gc.cumsum(dim=2)  # [H, NC, C, K]
    kg, kn, qg = kc * torch.exp(G), kc * torch.exp(-G), qc * torch.exp(G)
    eye = torch.eye(chunk_size, dtype=torch.float32, device=q.device)
    unit_lower = eye + bc[..., None] * (kg @ kn.transpose(-1, -2)).tril(-1)  # I + M
    rhs = torch.cat([bc[..., None] * vc, bc[..., None] * kg], dim=-1)
    solved = torch.linalg.solve_triangular(unit_lower, rhs, upper=False, unitriangular=True)
    U, W = solved[..., :value_dim], solved[..., value_dim:]  # [H, NC, C, V], [H, NC, C, K]
    G_last = G[:, :, -1:, :]  # [H, NC, 1, K]
    k_to_end = kc * torch.exp(G_last - G)  # k_j decayed to the chunk's end
    decay_end = torch.exp(G_last).transpose(-1, -2)  # [H, NC, K, 1]

    chunk_states = qc.new_empty(num_heads, num_chunks, head_dim, value_dim)  # S at chunk starts
    deltas = qc.new_empty(num_heads, num_chunks, chunk_size, value_dim)
    state = initial_state.float().transpose(-1, -2)  # [H, K, V]
    for c in range(num_chunks):
        chunk_states[:, c] = state
        delta = torch.baddbmm(U[:, c], W[:, c], state, alpha=-1.0)
        deltas[:, c] = delta
        state = torch.baddbmm(decay_end[:, c] * state, k_to_end[:, c].transpose(-1, -2), delta)

    scores = (qg @ kn.transpose(-1, -2)).tril()
    o = scale * (qg @ chunk_states + scores @ deltas)  # [H, NC, C, V]
    o = o.movedim(0, 2).reshape(num_chunks * chunk_size, num_heads, value_dim)[:num_tokens]

    checkpoints = []
    for p in checkpoint_offsets:
        if not 0 <= p <= num_tokens:
            raise ValueError(f"checkpoint offset {p} outside 0..{num_tokens}")
        if p == 0:
            checkpoints.append(initial_state.float())
            continue
        c, local = (p - 1) // chunk_size, (p - 1) % chunk_size + 1
        g_p = G[:, c, local - 1 : local, :]  # [H, 1, K]
        k_decayed = kc[:, c, :local] * torch.exp(g_p - G[:, c, :local])
        s_p = (
            g_p.exp().transpose(-1, -2) * chunk_states[:, c]
            + k_decayed.transpose(-1, -2) @ (deltas[:, c, :local])
        )
        checkpoints.append(s_p.transpose(-1, -2))
    empty = q.new_zeros(0, num_heads, value_dim, head_dim, dtype=torch.float32)
    stacked = torch.stack(checkpoints) if checkpoints else empty
    return o, state.transpose(-1, -2).contiguous(), stacked.contiguous()


@dataclass(frozen=True)
class PrefillResult:
    """One prefill call over all layers.

    logits: fp32 [vocab], the next-token logits after the last token; final_state: fp32
    [layers, H, V, K]; checkpoint_states: fp32 [C, layers, H, V, K], one per requested offset.
    """

    logits: torch.Tensor
    final_state: torch.Tensor
    checkpoint_states: torch.Tensor


@dataclass(frozen=True)
class PrefillCall:
    """Tokens start:stop of the prompt in one call; checkpoints: absolute positions to export."""

    start: int
    stop: int
    checkpoints: tuple[int, ...]


def plan_prefill_calls(
    start: int,
    stop: int,
    *,
    block_tokens: int,
    checkpoint_export: bool,
    capacity: int = CHECKPOINT_CAPACITY,
) -> list[PrefillCall]:
    """Split the computed span start:stop into prefill calls.

    Export off: one call, no checkpoints. Export on: the block boundaries strictly inside the
    span (multiples of block_tokens) are taken in order, `capacity` of them as one call's
    checkpoints, the next one as that call's end; the last call ends at `stop`.
    """
    if not 0 <= start < stop:
        raise ValueError(f"empty or inverted prefill span {start}:{stop}")
    if not checkpoint_export:
        return [PrefillCall(start, stop, ())]
    first = (start // block_tokens + 1) * block_tokens
    boundaries = list(range(first, stop, block_tokens))
    calls, call_start = [], start
    while boundaries:
        checkpoints, boundaries = boundaries[:capacity], boundaries[capacity:]
        call_stop = boundaries.pop(0) if boundaries else stop
        calls.append(PrefillCall(call_start, call_stop, tuple(checkpoints)))
        call_start = call_stop
    if call_start < stop:
        calls.append(PrefillCall(call_start, stop, ()))
    return calls


@dataclass(frozen=True)
class PromptPrefill:
    """A prompt's prefill through the cache: what was reused, computed and exported."""

    logits: torch.Tensor  # [vocab] fp32, next-token logits after the prompt
    state: torch.Tensor  # [layers, H, V, K] fp32, the state after the prompt
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    checkpoints_exported: int  # block-boundary states cached besides the prompt-end state
    kernel_calls: int


@dataclass(frozen=True)
class GeneratedToken:
    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]]  # the `top` most likely tokens and their logprobs


class Engine:
    """The reference model on one device with one prefill backend; not thread-safe (serialise)."""

    def __init__(self, model: KdaModel, backend: str | None = None):
        self.model = model
        self.device = model.device
        self.backend = backend or ("kernel" if self.device.type == "cuda" else "chunk")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown prefill backend {self.backend!r}; expected {BACKENDS}")
        cfg = model.config
        self.scale = cfg.head_dim**-0.5
        self._kda_prefill = None
        if self.backend == "kernel":
            from kdabench.kernels import kda_prefill  # imports Triton: only when asked for

            self._kda_prefill = kda_prefill

    # -- one layer's KDA over a span ------------------------------------------------------

    def _kda_layer(
        self, x: KdaInputs, initial: torch.Tensor | None, offsets: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """KDA over one span: o [T, H, V], final state [H, V, K], checkpoints [C, H, V, K]."""
        cfg = self.model.config
        common = {
            "gate": "sigmoid", "lower_bound": cfg.lower_bound, "A_log": x.A_log,
            "dt_bias": x.dt_bias, "qk_l2norm": True, "beta_sigmoid": True, "scale": self.scale,
        }  # fmt: skip
        if self.backend == "mirror":
            result = chunk_kda_mirror(
                x.q, x.k, x.v, x.raw_gate, x.beta_logits,
                initial_state=None if initial is None else initial[None],
                checkpoint_offsets=[list(offsets)], **common,
            )  # fmt: skip
            return result.o, result.final_state[0], result.checkpoint_states[0]
        if self.backend == "chunk":
            prepared = prepare_inputs(
                x.q, x.k, x.v, x.raw_gate, x.beta_logits,
                initial_state=None if initial is None else initial[None],
                dtype=torch.float32, **common,
            )  # fmt: skip
            return chunk_kda_cpu(
                prepared.q, prepared.k, prepared.v, prepared.g, prepared.beta,
                prepared.initial_state[0], self.scale, offsets,
            )  # fmt: skip
        return self._kernel_layer(x, initial, offsets, common)

    def _kernel_layer(self, x, initial, offsets, common):
        cfg, device = self.model.config, self.device
        if len(offsets) > CHECKPOINT_CAPACITY:
            raise ValueError(
                f"{len(offsets)} checkpoints in one call; capacity {CHECKPOINT_CAPACITY}"
            )
        H, D = cfg.num_heads, cfg.head_dim
        pool = torch.zeros(2 + CHECKPOINT_CAPACITY, H, D, D, dtype=torch.float32, device=device)
        if initial is not None:
            pool[0] = initial

        def index(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32, device=device)

        ck_offsets = [[*offsets, *[1] * (CHECKPOINT_CAPACITY - len(offsets))]]
        ck_slots = [[2 + c if c < len(offsets) else -1 for c in range(CHECKPOINT_CAPACITY)]]
        result = self._kda_prefill(
            x.q, x.k, x.v, x.raw_gate, x.beta_logits, state_pool=pool,
            cu_seqlens=index([0, x.q.shape[0]]),
            initial_state_indices=index([0 if initial is not None else -1]),
            final_state_indices=index([1]),
            checkpoint_offsets=index(ck_offsets), checkpoint_state_indices=index(ck_slots),
            **common,
        )  # fmt: skip
        code = int(result.error_code.item())
        if code:
            from kdabench.kernels import decode_error_code

            raise RuntimeError(f"kda_prefill refused the metadata: {decode_error_code(code)}")
        return result.o, pool[1].clone(), pool[2 : 2 + len(offsets)].clone()

    # -- whole-model prefill and decode ---------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self,
        tokens: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        checkpoint_offsets: Sequence[int] = (),
    ) -> PrefillResult:
        """Run the model over `tokens` [T] from `initial_state` (None: zeros); offsets are
        relative to the span's start, each in 1..T-1, increasing."""
        model, num_layers = self.model, self.model.config.num_layers
        x = model.embed(tokens)
        finals, checkpoints = [], []
        for layer in range(num_layers):
            initial = None if initial_state is None else initial_state[layer]
            o, final, ck = self._kda_layer(model.kda_inputs(layer, x), initial, checkpoint_offsets)
            x = model.finish_layer(layer, x, o)
            finals.append(final)
            checkpoints.append(ck)
        logits = model.logits(x[-1:])[0]
        return PrefillResult(logits, torch.stack(finals), torch.stack(checkpoints, dim=1))

    @torch.inference_mode()
    def decode_step(self, state: torch.Tensor, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed one token: (next-token logits [vocab], new state); `state` is not modified."""
        model, cfg = self.model, self.model.config
        x = model.embed(torch.tensor([token], device=self.device))
        new_state = []
        for layer in range(cfg.num_layers):
            inp = model.kda_inputs(layer, x)
            q, k = l2_normalize(inp.q[0].float()), l2_normalize(inp.k[0].float())  # [H, K]
            v = inp.v[0].float()  # [H, V]
            g = log_decay(
                inp.raw_gate, "sigmoid", lower_bound=cfg.lower_bound, A_log=inp.A_log,
                dt_bias=inp.dt_bias, dtype=torch.float32,
            )[0]  # fmt: skip
            beta = torch.sigmoid(inp.beta_logits[0].float())  # [H]
            s = state[layer] * torch.exp(g)[:, None, :]  # [H, V, K]
            error = v - (s @ k[:, :, None])[..., 0]  # v - S^T k in the K-first view, [H, V]
            s = s + beta[:, None, None] * error[:, :, None] * k[:, None, :]
            o = self.scale * (s @ q[:, :, None])[..., 0]  # [H, V]
            x = model.finish_layer(layer, x, o[None])
            new_state.append(s)
        return model.logits(x)[0], torch.stack(new_state)

    # -- prompts through the prefix cache -------------------------------------------------

    def prefill_prompt(
        self, tokens: Sequence[int], cache: PrefixCache, settings: CacheSettings
    ) -> PromptPrefill:
        """Prefill a prompt, resuming from the cache and filling it (see the module docstring)."""
        if not tokens:
            raise ValueError("a prompt needs at least one token")
        hit = cache.lookup(tokens)
        token_tensor = torch.tensor(list(tokens), dtype=torch.int64, device=self.device)
        calls = plan_prefill_calls(
            hit.length, len(tokens), block_tokens=settings.block_tokens,
            checkpoint_export=settings.checkpoint_export,
        )  # fmt: skip
        state = None if hit.state is None else hit.state.to(self.device)
        exported = 0
        result = None
        for call in calls:
            offsets = [p - call.start for p in call.checkpoints]
            result = self.prefill(token_tensor[call.start : call.stop], state, offsets)
            for position, checkpoint in zip(call.checkpoints, result.checkpoint_states):
                cache.insert(tokens[:position], checkpoint)
                exported += 1
            state = result.final_state
            if call.stop < len(tokens):  # a block boundary that ended a call
                cache.insert(tokens[: call.stop], state)
                exported += 1
        cache.insert(tokens, state)
        return PromptPrefill(
            logits=result.logits, state=state, prompt_tokens=len(tokens),
            cached_tokens=hit.length, computed_tokens=len(tokens) - hit.length,
            checkpoints_exported=exported, kernel_calls=len(calls),
        )  # fmt: skip

    def generate(
        self, prefilled: PromptPrefill, max_tokens: int, top_logprobs: int = 0
    ) -> Iterator[GeneratedToken]:
        """Greedy tokens after a prefilled prompt, with the chosen token's logprob.

        The first token comes from the prefill's logits; each later one costs a decode step.
        """
        logits, state = prefilled.logits, prefilled.state
        for step in range(max_tokens):
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            token = int(torch.argmax(logprobs))
            top: list[tuple[int, float]] = []
            if top_logprobs:
                values, indices = torch.topk(logprobs, min(top_logprobs, logprobs.numel()))
                top = list(zip(indices.tolist(), values.tolist()))
            yield GeneratedToken(token, float(logprobs[token]), top)
            if step + 1 < max_tokens:
                logits, state = self.decode_step(state, token)
