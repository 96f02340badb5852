"""The profile-configs scenario: each distinct kernel config of the device's profile, forced in
turn on one case's inputs and checked against one float64 oracle run.

Under AUTO the policy gives a call the config of the profile entry for its query, so every
config a profile holds must be as right as the heuristic one (which the other scenarios
qualify). A config the case's head_dim cannot take comes only from entries for another
head_dim, which the policy never picks for this one; it is listed as not run.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from kdabench.matrix import Case
from kdabench.qualify.harness import (
    Context,
    Outcome,
    case_caps,
    check_valid,
    index_dtype,
    kernels_api,
    make_pool,
    oracle,
    result_of,
    shape_record,
    valid_run,
)

if TYPE_CHECKING:
    from kdabench.kernels import KernelConfig

_SHORT = {"chunk_size": "c", "block_v": "bv", "num_warps": "w", "num_stages": "s",
          "prepare_warps": "pw", "segments": "seg", "checkpoints": "checkpoints-in-"}


def config_label(config: KernelConfig) -> str:
    """A KernelConfig in a few words: "c16 bv32 w4 s2 pw4 tf32 bfloat16 split seg1 inverse
    checkpoints-in-kernel"."""
    return " ".join(f"{_SHORT[name]}{value}" if name in _SHORT
                    else value if isinstance(value, str) else f"{name}={value}"
                    for name, value in dataclasses.asdict(config).items())


def _summary(one: Outcome, tol: dict[str, float]) -> str:
    """One config's checks in a line: each error against its tolerance, the untouched slots."""
    parts = []
    for name, error in one.errors.items():
        limit = tol["output" if name == "output" else "state"]
        parts.append(f"{name} {error:.2e} {'<=' if error <= limit else '>'} {limit:.1e}")
    if "unwritten_slots_unchanged" in one.checks:
        parts.append("unwritten slots " + ("unchanged" if one.checks["unwritten_slots_unchanged"]
                                           else "written"))
    return ", ".join(parts) or "; ".join(one.failures)


def _not_triton_note(ctx: Context) -> str:
    """Why a run of another backend than Triton has no profile configs to force."""
    if ctx.config is not None:
        default = dataclasses.asdict(type(ctx.config)())
        fields = [f"{name}={value}" for name, value in dataclasses.asdict(ctx.config).items()
                  if value != default[name]]
        runs = f"every case of this run pins the config with {', '.join(fields) or 'defaults'}"
    else:
        runs = f"a plan for the {ctx.backend} backend takes its default config"
    return (f"{runs}, qualified by the other scenarios; a profile's configs are Triton's, and "
            "its cute configs reach only plans with backend \"auto\" (qualify each with "
            "--backend cute-s<N> or cute-wgmma)")


def run_profile_configs(ctx: Context, case: Case) -> Outcome:
    """Every distinct config of the device's profile on the case's inputs, vs one oracle run."""
    from kdabench.kernels.catalog import config_problems
    from kdabench.kernels.folders import shown_folder
    from kdabench.kernels.policy import device_name_of
    from kdabench.kernels.profiles import find_profile, profile_dir, profile_path

    out = Outcome()
    if ctx.backend != "triton":
        out.note = _not_triton_note(ctx)
        return out
    kernels = kernels_api()
    device = device_name_of(ctx.device)
    profile = find_profile(device)
    if profile is None or not profile.entries:
        why = (f"no profile for device {device!r} ({profile_path(device).name} not in "
               f"{shown_folder(profile_dir())})" if profile is None else f"profile {profile.name} has no entries")
        out.note = f"{why}: the heuristic is the only config (qualified by the other scenarios)"
        return out
    head_dim = case.params["head_dim"]
    configs: dict[KernelConfig, list[str]] = {}
    for entry in profile.entries.values():
        configs.setdefault(entry.config, []).append(entry.query.describe())
    runnable = {c: queries for c, queries in configs.items() if not config_problems(c, head_dim)}
    not_run = {config_label(c): config_problems(c, head_dim) for c in configs
               if c not in runnable}
    out.details.update(profile=profile.name, configs=[])
    if not_run:
        out.details["not_run"] = not_run
    if not runnable:
        out.note = (f"none of the {len(configs)} configs of {profile.name} can run head_dim "
                    f"{head_dim}: the policy picks them only for other head dims")
        return out

    x, meta, _ = valid_run(ctx, case)
    before = make_pool(ctx, meta, x)
    ref = oracle(ctx, x, meta, before)  # once, for every config
    caps = case_caps(ctx, case, meta, x.q.shape[0])
    tol = case.options["tolerances"]
    lines = []
    for config, queries in runnable.items():
        label = config_label(config)
        pool = before.clone()
        binding = kernels.bind(kernels.plan(caps, config), x.q, x.k, x.v, x.g, x.beta,
                               state_pool=pool, A_log=x.A_log, dt_bias=x.dt_bias,
                               **meta.tensors(ctx.device, index_dtype(case)))
        output, code = result_of(kernels.run(binding))
        one = Outcome()
        check_valid(one, ctx, case, x, meta, pool, before, output, code, ref=ref)
        for name, error in one.errors.items():
            out.errors[name] = max(error, out.errors.get(name, 0.0))
        summary, verdict = _summary(one, tol), "fail" if one.failures else "pass"
        entries = (f"entry for {queries[0]}" if len(queries) == 1
                   else f"entries for {'; '.join(queries)}")
        lines.append(f"{label} (profile {entries}): {summary} -> {verdict}")
        if one.failures:
            out.failures.append(f"{label}: {summary}")
        out.details["configs"].append({
            "config": label, "queries": queries, "error_code": code, "errors": one.errors,
            "verdict": verdict})
    out.shape = shape_record(meta)
    out.checks["configs"] = lines
    out.kernel = {
        "kernel_config": [dataclasses.asdict(c) for c in runnable],
        "config_source": f"explicit: each distinct config of {profile.name} "
                         f"({len(runnable)} from {len(profile.entries)} entries)",
        "policy_mode": None,
    }
    return out
