"""Prefill (chunked, retaining states into the prefix cache) and greedy decode for the model.

Prefill backends, one math (docs/DESIGN.md §2, gate="sigmoid", qk_l2norm, beta_sigmoid):

* "kernel": `kdabench.kernels` (the default on CUDA), planned once per engine (capacity 4, up
  to `max_batched_tokens` tokens) and bound per layer and call to that layer's state pool.
* "chunk": `chunk_kda_cpu` below, the default on the CPU: the chunk mirror's algorithm with
  every chunk's intra-chunk work batched at once (heads x chunks), leaving only the state
  hand-off between chunks as a Python loop; checked against the mirror in the tests.
* "mirror": `kdabench.oracles.chunk_kda_mirror`, the readable chunked algorithm in plain
  torch fp32, one chunk at a time (slower; the reference the "chunk" path is tested against).

Every backend reads and writes states in a pool [layers, slots, H, V, K] by slot index, as the
kernel does: a call's initial state, its final state and its checkpoints are slots.

Decode runs one token at a time through a small fp32 recurrence in the pool layout
(S [H, V, K]):  S = S * exp(g);  S += beta (v - S k) k^T;  o = scale S q.

`Engine.prefill_prompt` ties it to the prefix cache: resume from the longest cached prefix,
split the rest into calls of at most `max_batched_tokens` tokens with the states the retention
policy keeps (`kdabench.serve.retention`), and let each call write those states straight into
reserved cache slots. One metadata upload per prompt, no host sync until the logits, and the
same calls with export on or off: export adds only the kernel's checkpoint writes. With
`cuda_graphs` (the default for the kernel backend on CUDA) each call is a replay of a graph
captured per token bucket (`kdabench.serve.call_graphs`) instead of every layer's operations
queued anew.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from kdabench.oracles import chunk_kda_mirror, l2_normalize, log_decay, prepare_inputs

from .call_graphs import CallGraphs
from .model import KdaInputs, KdaModel
from .prefix_cache import PrefixCache, prefix_digests
from .retention import CHECKPOINT_CAPACITY, plan_prefill_calls
from .settings import CacheSettings

BACKENDS = ("kernel", "chunk", "mirror")
CHUNK_SIZE = 16  # as the mirror: chunk * |lower_bound| must stay under ~88 (exp(-G) in fp32)
META_WIDTH = 4 + 2 * CHECKPOINT_CAPACITY  # cu_seqlens (2), initial, final, offsets, slots


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
    """One prefill call over all layers (the functional form, `Engine.prefill`).

    logits: fp32 [vocab], the next-token logits after the last token; final_state: fp32
    [layers, H, V, K]; checkpoint_states: fp32 [C, layers, H, V, K], one per requested offset.
    """

    logits: torch.Tensor
    final_state: torch.Tensor
    checkpoint_states: torch.Tensor


@dataclass(frozen=True)
class CallSlots:
    """One call's state slots: initial (-1: zeros), final, and (offset, slot) checkpoints."""

    initial: int
    final: int
    checkpoints: tuple[tuple[int, int], ...] = ()

    def row(self, num_tokens: int) -> list[int]:
        """The call's kernel metadata as one int32 row (see META_WIDTH)."""
        pad = CHECKPOINT_CAPACITY - len(self.checkpoints)
        offsets = [offset for offset, _ in self.checkpoints] + [1] * pad
        slots = [slot for _, slot in self.checkpoints] + [-1] * pad
        return [0, num_tokens, self.initial, self.final, *offsets, *slots]


@dataclass(frozen=True)
class PromptPrefill:
    """A prompt's prefill through the cache: what was reused, computed and retained."""

    logits: torch.Tensor  # [vocab] fp32, next-token logits after the prompt
    state: torch.Tensor  # [layers, H, V, K] fp32, the state after the prompt
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    checkpoints_exported: int  # block-boundary states cached besides the prompt-end state
    kernel_calls: int
    timing: Mapping[str, float] = field(default_factory=dict)  # ms per phase (server_timing)
    compute_detail: Mapping[str, float] = field(default_factory=dict)  # ms inside compute_ms


class DeviceClock:
    """The device's own time for the work queued between construction and `stop()` (CUDA
    events; nothing elsewhere). Set against the host's time, it says whether a slow prefill
    waited for the GPU or the GPU waited for the host."""

    def __init__(self, device: torch.device):
        self._events = None
        if device.type == "cuda":
            self._events = tuple(torch.cuda.Event(enable_timing=True) for _ in range(2))
            self._events[0].record()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()

    def elapsed(self) -> dict[str, float]:
        """{"device_ms": ms} once the device passed `stop()` (synchronises), else {}."""
        if self._events is None:
            return {}
        self._events[1].synchronize()
        return {"device_ms": self._events[0].elapsed_time(self._events[1])}


@dataclass(frozen=True)
class GeneratedToken:
    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]]  # the `top` most likely tokens and their logprobs


class Engine:
    """The model on one device with one prefill backend; not thread-safe (serialise).

    max_tokens: the most tokens one call takes (the kernel's plan); max_slots: the most
    slots a state pool it is given has.
    """

    def __init__(
        self,
        model: KdaModel,
        backend: str | None = None,
        *,
        max_tokens: int = 8192,
        max_slots: int = 2 + CHECKPOINT_CAPACITY,
        cuda_graphs: bool | None = None,
    ):
        self.model = model
        self.device = model.device
        self.backend = backend or ("kernel" if self.device.type == "cuda" else "chunk")
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown prefill backend {self.backend!r}; expected {BACKENDS}")
        graphable = self.backend == "kernel" and self.device.type == "cuda"
        if cuda_graphs and not graphable:
            raise ValueError("CUDA graphs need the kernel backend on a CUDA device "
                             f"(here: {self.backend} on {self.device.type})")
        self.cuda_graphs = graphable if cuda_graphs is None else cuda_graphs
        self._graphs: dict[int, CallGraphs] = {}  # per state pool (its data pointer)
        cfg = model.config
        self.scale = cfg.head_dim**-0.5
        self.max_tokens = max_tokens
        self._plan = None
        self._errors = torch.zeros(1, dtype=torch.int32, device=self.device)
        if self.backend == "kernel":
            from kdabench.kernels import api  # imports Triton: only when asked for

            self._api = api
            self._plan = api.plan(
                api.Caps(
                    device=self.device, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
                    max_tokens=max_tokens, max_seqs=1, max_state_slots=max_slots,
                    max_checkpoints=CHECKPOINT_CAPACITY, gate="sigmoid",
                    lower_bound=cfg.lower_bound, qk_l2norm=True, beta_sigmoid=True,
                ),
                activation_dtype=torch.bfloat16,
            )  # fmt: skip

    def describe(self) -> dict[str, object]:
        """The backend and, for the kernel, its config and where it came from."""
        if self._plan is None:
            return {"backend": self.backend, "cuda_graphs": False}
        return {"backend": self.backend, "kernel_config": repr(self._plan.config),
                "kernel_config_source": self._plan.config_source,
                "cuda_graphs": self.cuda_graphs}

    # -- one layer's KDA over a call, on a state pool ---------------------------------------

    def _kda_layer(
        self, x: KdaInputs, pool: torch.Tensor, slots: CallSlots, meta: torch.Tensor | None
    ) -> torch.Tensor:
        """KDA over one call on `pool` [slots, H, V, K] (one layer's); returns o [T, H, V]."""
        if self.backend == "kernel":
            return self._kernel_layer(x, pool, meta)
        cfg = self.model.config
        initial = None if slots.initial < 0 else pool[slots.initial][None]
        offsets = [offset for offset, _ in slots.checkpoints]
        common = {
            "gate": "sigmoid", "lower_bound": cfg.lower_bound, "A_log": x.A_log,
            "dt_bias": x.dt_bias, "qk_l2norm": True, "beta_sigmoid": True, "scale": self.scale,
        }  # fmt: skip
        if self.backend == "mirror":
            result = chunk_kda_mirror(
                x.q, x.k, x.v, x.raw_gate, x.beta_logits, initial_state=initial,
                checkpoint_offsets=[offsets], **common,
            )  # fmt: skip
            o, final, checkpoints = result.o, result.final_state[0], result.checkpoint_states[0]
        else:
            p = prepare_inputs(
                x.q, x.k, x.v, x.raw_gate, x.beta_logits, initial_state=initial,
                dtype=torch.float32, **common,
            )  # fmt: skip
            o, final, checkpoints = chunk_kda_cpu(
                p.q, p.k, p.v, p.g, p.beta, p.initial_state[0], self.scale, offsets
            )
        pool[slots.final] = final
        for (_, slot), state in zip(slots.checkpoints, checkpoints):
            pool[slot] = state
        return o

    def _kernel_layer(self, x: KdaInputs, pool: torch.Tensor, meta: torch.Tensor | None):
        assert meta is not None and self._plan is not None
        api, C = self._api, CHECKPOINT_CAPACITY
        binding = api.bind(
            self._plan, x.q, x.k, x.v, x.raw_gate, x.beta_logits, state_pool=pool,
            cu_seqlens=meta[0:2], initial_state_indices=meta[2:3],
            final_state_indices=meta[3:4], checkpoint_offsets=meta[4 : 4 + C].view(1, C),
            checkpoint_state_indices=meta[4 + C :].view(1, C), A_log=x.A_log,
            dt_bias=x.dt_bias, scale=self.scale,
        )  # fmt: skip
        result = api.run(binding)
        self._errors.bitwise_or_(result.error_code)  # checked once per prompt: no sync here
        return result.o

    def _run_call(
        self, tokens: torch.Tensor, pool: torch.Tensor, slots: CallSlots, meta: torch.Tensor | None,
        last: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Every layer over one call; returns the residual stream after the last token [1, D]
        (after the token at index `last` [1] on the device where one is given: a padded call,
        kdabench.serve.call_graphs)."""
        model = self.model
        x = model.embed(tokens)
        for layer in range(model.config.num_layers):
            o = self._kda_layer(model.kda_inputs(layer, x), pool[layer], slots, meta)
            x = model.finish_layer(layer, x, o)
        return x[-1:] if last is None else x.index_select(0, last)

    def _call(self, tokens: torch.Tensor, cache: PrefixCache, slots: CallSlots,
              meta: torch.Tensor | None) -> torch.Tensor:
        """One call of a prompt's prefill: a graph replay where the engine has CUDA graphs."""
        if not self.cuda_graphs:
            return self._run_call(tokens, cache.pool, slots, meta)
        assert meta is not None
        return self._graphs_for(cache).run(tokens, meta)

    def _graphs_for(self, cache: PrefixCache) -> CallGraphs:
        key = cache.pool.data_ptr()
        if key not in self._graphs:
            pool, from_metadata = cache.pool, CallSlots(-1, -1)  # the kernel reads m's slots
            self._graphs[key] = CallGraphs(
                lambda t, m, last: self._run_call(t, pool, from_metadata, m, last),
                self.max_tokens, CallSlots(-1, cache.scratch(0)).row, self.device,
            )  # fmt: skip
        return self._graphs[key]

    def capture_graphs(self, cache: PrefixCache) -> list[int]:
        """Capture every bucket's graph on the cache's pool now (none without CUDA graphs);
        the buckets captured."""
        if not self.cuda_graphs:
            return []
        with torch.inference_mode():
            graphs = self._graphs_for(cache)
            graphs.capture_all()
        self._check_errors()
        return graphs.captured

    def _upload(self, rows: list[list[int]]) -> torch.Tensor | None:
        """All calls' kernel metadata in one host-to-device copy (None off the kernel)."""
        if self.backend != "kernel":
            return None
        return torch.tensor(rows, dtype=torch.int32).to(self.device, non_blocking=True)

    def _check_errors(self) -> None:
        """Raise if any kernel call since the last check refused its metadata (one sync)."""
        if self.backend != "kernel":
            return
        code = int(self._errors.item())
        if code:
            self._errors.zero_()
            from kdabench.kernels import decode_error_code

            raise RuntimeError(f"kda_prefill refused the metadata: {decode_error_code(code)}")

    # -- whole-model prefill and decode ---------------------------------------------------

    @torch.inference_mode()
    def prefill(
        self,
        tokens: torch.Tensor,
        initial_state: torch.Tensor | None = None,
        checkpoint_offsets: Sequence[int] = (),
    ) -> PrefillResult:
        """Run the model over `tokens` [T] from `initial_state` (None: zeros) in one call on a
        pool of its own; offsets are relative to the span's start, each in 1..T-1, increasing."""
        cfg = self.model.config
        layers, H, V, K = cfg.state_shape
        pool = torch.zeros(layers, 2 + CHECKPOINT_CAPACITY, H, V, K, device=self.device)
        if initial_state is not None:
            pool[:, 0] = initial_state
        slots = CallSlots(
            0 if initial_state is not None else -1, 1,
            tuple((offset, 2 + c) for c, offset in enumerate(checkpoint_offsets)),
        )  # fmt: skip
        meta = self._upload([slots.row(len(tokens))])
        x = self._run_call(tokens.to(self.device), pool, slots, None if meta is None else meta[0])
        self._check_errors()
        checkpoints = pool[:, 2 : 2 + len(checkpoint_offsets)].movedim(1, 0).clone()
        return PrefillResult(self.model.logits(x)[0], pool[:, 1].clone(), checkpoints)

    @torch.inference_mode()
    def prefill_prompt(
        self, tokens: Sequence[int], cache: PrefixCache, settings: CacheSettings
    ) -> PromptPrefill:
        """Prefill a prompt, resuming from the cache and filling it (see the module docstring)."""
        if not tokens:
            raise ValueError("a prompt needs at least one token")
        began = time.perf_counter()
        data = bytes(tokens)
        hit = cache.lookup(data)
        calls = plan_prefill_calls(
            hit.length, len(tokens), block_tokens=settings.block_tokens,
            max_batched_tokens=settings.max_batched_tokens,
            checkpoint_export=settings.checkpoint_export,
        )  # fmt: skip
        wanted = [p for call in calls for p in call.retained] + [len(tokens)]
        reserved = cache.reserve(len(wanted), pinned=hit.slot)
        slot_of = dict(zip(reversed(wanted), reserved))  # the prompt's end first, then latest
        plan, previous = [], -1 if hit.slot is None else hit.slot
        for index, call in enumerate(calls):
            final = slot_of.get(call.stop, cache.scratch(index))
            checkpoints = tuple(
                (p - call.start, slot_of[p]) for p in call.checkpoints if p in slot_of
            )
            plan.append(CallSlots(previous, final, checkpoints))
            previous = final
        meta = self._upload([s.row(c.stop - c.start) for c, s in zip(calls, plan)])
        token_tensor = torch.tensor(list(tokens), dtype=torch.int64).to(self.device)
        planned = time.perf_counter()
        clock = DeviceClock(self.device)
        x = None
        for index, (call, slots) in enumerate(zip(calls, plan)):
            x = self._call(
                token_tensor[call.start : call.stop], cache, slots,
                None if meta is None else meta[index],
            )  # fmt: skip
        assert x is not None
        logits = self.model.logits(x)[0]
        clock.stop()
        enqueued = time.perf_counter()
        try:
            self._check_errors()
        except RuntimeError:
            cache.release(reserved)
            raise
        computed = time.perf_counter()  # the error check waited for the device
        keys = prefix_digests(data, slot_of)
        for position, slot in slot_of.items():
            cache.commit(keys[position], position, slot)
        done = time.perf_counter()
        return PromptPrefill(
            logits=logits, state=cache.state(previous), prompt_tokens=len(tokens),
            cached_tokens=hit.length, computed_tokens=len(tokens) - hit.length,
            checkpoints_exported=len(slot_of) - (len(tokens) in slot_of),
            kernel_calls=len(calls),
            timing={"lookup_ms": (planned - began) * 1e3, "compute_ms": (computed - planned) * 1e3,
                    "commit_ms": (done - computed) * 1e3},
            compute_detail={"enqueue_ms": (enqueued - planned) * 1e3, **clock.elapsed()},
        )  # fmt: skip

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
