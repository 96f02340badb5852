"""From what a sweep measured to what it reports: the receipt's cases and the live table.

Per arm: a ``server`` case (activation), a ``failure`` case if its server failed, a
``probe`` case, one ``cold-ttft`` case per prompt size, a ``shared-prefix`` case and a
``decode`` case. An arm whose activation patterns failed has every number flagged not
valid and failed.
"""

from __future__ import annotations

from typing import Any

from kdabench.sweep import stats
from kdabench.sweep.options import SweepOptions
from kdabench.sweep.state import ArmState


def live_rows(states: list[ArmState], options: SweepOptions) -> list[dict[str, Any]]:
    """Rows of the live table: one per arm and prompt size."""
    rows = []
    for state in states:
        for size in options.prompt_tokens:
            ttfts = [r["ttft_ms"] for r in state.samples.get(size, [])]
            median_ms = stats.median(ttfts)
            tokens = _median_tokens(state.samples.get(size, []), size)
            rows.append({
                "arm": state.arm.name, "prompt_tokens": size, "n": len(ttfts),
                "discarded": len(state.discarded.get(size, [])), "median_ms": median_ms,
                "rate_tok_s": _rate(tokens, median_ms),
                "status": ("failed" if state.failure else
                           "not activated" if state.activation_status == "failed" else ""),
            })
    return rows


def sweep_cases(states: list[ArmState], options: SweepOptions) -> list[dict[str, Any]]:
    """The receipt's cases for everything measured so far."""
    cases: list[dict[str, Any]] = []
    for index, state in enumerate(states):
        cases.extend(_arm_cases(state, index, options))
    return cases


def _arm_cases(state: ArmState, index: int, options: SweepOptions) -> list[dict[str, Any]]:
    arm = state.arm.name
    activation = state.activation_status
    invalid = activation == "failed"
    flag = ({"valid": False, "message": "arm not activated: its activation patterns "
             "failed, so its numbers are not valid"} if invalid else {"valid": True})
    cases = [{
        "id": f"server/{arm}", "kind": "server", "arm": arm,
        "verdict": "fail" if invalid or state.failure else "pass",
        "activation": activation, "activation_before": state.activation_before,
        "activation_after": state.activation_after, **state.info,
        "message": (state.failure["message"] if state.failure else
                    "activation patterns failed" if invalid else
                    "activation not checked (no server log)"
                    if activation == "not checked" else "activated"),
    }]
    if state.failure:
        cases.append({"id": f"failure/{arm}", "kind": "failure", "arm": arm,
                      "verdict": "error", **state.failure})
    if state.probe is not None:
        failed = [name for name, ok in state.probe["checks"].items() if ok is False]
        cases.append({"id": f"probe/{arm}", "kind": "probe", "arm": arm,
                      "verdict": "fail" if failed else "pass",
                      "message": f"failed: {', '.join(failed)}" if failed else "passed",
                      **state.probe})
    for size in options.prompt_tokens:
        samples = state.samples.get(size, [])
        discarded = state.discarded.get(size, [])
        warmups = state.warmups.get(size, [])
        if not samples and not discarded and not warmups:
            continue
        ttfts = [r["ttft_ms"] for r in samples]
        summary = stats.summarize_samples(ttfts, seed=options.seed + index * 1009 + size)
        tokens = _median_tokens(samples, size)
        ci = summary["ci95"]
        verdict, message = "pass", f"{len(samples)} cold samples"
        if discarded:
            verdict = "fail"
            message = (f"{len(discarded)} sample(s) found cached or empty and discarded; "
                       f"{len(samples)} counted")
        elif len(samples) < options.samples:
            verdict = "error" if state.failure else "fail"
            message = f"{len(samples)} of {options.samples} samples taken"
        if invalid:
            verdict, message = "fail", flag["message"]
        cases.append({
            "id": f"cold/{arm}/{size}", "kind": "cold-ttft", "arm": arm,
            "prompt_tokens_requested": size, "prompt_tokens": tokens,
            "samples_ms": ttfts, "median_ms": summary["median"], "ci95_ms": ci,
            "min_ms": summary["min"], "max_ms": summary["max"], "n": summary["n"],
            "rate_tok_s": _rate(tokens, summary["median"]),
            "rate_ci95_tok_s": (None if ci is None or tokens is None else
                                [_rate(tokens, ci[1]), _rate(tokens, ci[0])]),
            "samples": samples, "discarded": discarded,
            "warmups_ms": [r["ttft_ms"] for r in warmups], "warmups": warmups,
            "activation": activation, **flag, "verdict": verdict, "message": message,
        })
    if state.shared_prefix:
        p2 = [r["p2_ttft_ms"] for r in state.shared_prefix if r["p2_ttft_ms"] is not None]
        p1 = [r["p1_ttft_ms"] for r in state.shared_prefix if r["p1_ttft_ms"] is not None]
        cached = [r["p2_cached_tokens"] for r in state.shared_prefix]
        cases.append({
            "id": f"shared-prefix/{arm}", "kind": "shared-prefix", "arm": arm,
            "total_tokens": options.shared_prefix_tokens,
            "shared_tokens": state.shared_prefix[0]["shared_tokens"],
            "p1_ttft_ms": p1, "p2_ttft_ms": p2, "p2_median_ms": stats.median(p2),
            "p1_median_ms": stats.median(p1), "p2_cached_tokens": cached,
            "samples": state.shared_prefix, "activation": activation, **flag,
            "verdict": "fail" if invalid or not p2 else "pass",
            "message": flag.get("message", f"P2 cached tokens {cached}"),
        })
    if state.decode is not None:
        decode_ok = bool(state.decode["output_tokens"])
        cases.append({
            "id": f"decode/{arm}", "kind": "decode", "arm": arm, **state.decode,
            "activation": activation, **flag,
            "verdict": "pass" if decode_ok and not invalid else "fail",
            "message": flag.get("message", "" if decode_ok else "no tokens in the window"),
        })
    return cases


def _rate(tokens: float | None, median_ms: float | None) -> float | None:
    if tokens is None or not median_ms:
        return None
    return tokens / (median_ms / 1000.0)


def _median_tokens(samples: list[dict[str, Any]], fallback: int) -> float | None:
    counts = [r["prompt_tokens"] for r in samples if r.get("prompt_tokens") is not None]
    if not samples:
        return None
    return stats.median(counts) if counts else float(fallback)
