"""The contract runner: host-side refusals of plan() and bind()."""

from __future__ import annotations

import dataclasses

import torch

from kdabench.inputs import make_inputs
from kdabench.matrix import Case
from kdabench.qualify.harness import Context, Outcome, kernels_api
from kdabench.qualify.metadata import build_metadata


def run_contract(ctx: Context, case: Case) -> Outcome:
    """Host-side contracts: plan refuses what it cannot run, bind refuses bad shapes."""
    out = Outcome()
    kernels = kernels_api()
    variant = case.params["variant"]
    base = kernels.Caps(device=ctx.device, num_heads=2, head_dim=64, max_tokens=32, max_seqs=2,
                        max_state_slots=64, max_checkpoints=2, backend=ctx.backend)
    if variant == "decode-names-every-bit":
        text = kernels.decode_error_code(sum(int(f) for f in kernels.MetadataFault))
        missing = [f.name for f in kernels.MetadataFault if f.name not in text]
        out.require(not missing, f"decode_error_code leaves out {missing}")
        out.require(kernels.decode_error_code(0) == "accepted",
                    "code 0 does not decode as accepted")
        return out
    refusals = {
        "plan-refuses-capacity-3": ({"max_checkpoints": 3}, "max_checkpoints"),
        "plan-refuses-head-dim-96": ({"head_dim": 96}, "head_dim"),
        "plan-refuses-lower-bound-6": ({"lower_bound": -6.0}, "lower_bound"),
        "plan-refuses-unknown-backend": ({"backend": "no-such-backend"}, "backend"),
    }
    if variant in refusals:
        change, word = refusals[variant]

        def attempt():
            return kernels.plan(dataclasses.replace(base, **change))
    else:
        planned = kernels.plan(base)
        heads = 3 if variant == "bind-refuses-wrong-heads" else 2
        x = make_inputs([16, 16], heads, 64, seed=ctx.seed(case), device=ctx.device)
        meta = build_metadata([16, 16], 2, "unaligned", ctx.rng(case))
        tensors = meta.tensors(ctx.device, torch.int32)
        if variant == "bind-refuses-vector-metadata-for-capacity-2":
            tensors["checkpoint_offsets"] = tensors["checkpoint_offsets"][:, 0].contiguous()
            tensors["checkpoint_state_indices"] = (
                tensors["checkpoint_state_indices"][:, 0].contiguous())
            word = "checkpoint_offsets"
        else:
            word = "q"
        pool = torch.zeros(meta.num_slots, 2, 64, 64, device=ctx.device)

        def attempt():
            return kernels.bind(planned, x.q, x.k, x.v, x.g, x.beta, state_pool=pool, **tensors)
    try:
        attempt()
    except kernels.KdaConfigError as error:
        out.details["message"] = str(error)
        out.require(word in str(error), f"the refusal does not name {word!r}: {error}")
    else:
        out.failures.append(f"{variant}: accepted instead of refused")
    return out
