"""From what a sweep measured to what it reports: the receipt's cases and the live table.

Per arm: a ``server`` case (activation), a ``failure`` case if its server failed, a
``probe`` case, one ``cold-ttft`` case per prompt size, a ``shared-prefix`` case and a
``decode`` case. An arm whose activation patterns failed has every number flagged not
valid and failed.

Unverified: a cold-TTFT case with a sample whose cache state the server did not report,
or a probe with a cache check it could not decide, passed nothing and failed nothing. The
receipt schema allows only pass/fail/error/skip, so such a case is verdict "skip" with
``status: "unverified"`` and says why in its message; :func:`case_ok` counts it as not
failed.
"""

from __future__ import annotations

from typing import Any

from kdabench import stats
from kdabench.sweep.options import SweepOptions
from kdabench.sweep.phases import (
    UNKNOWN,
    UNVERIFIABLE,
    VERIFIED_CACHED,
    VERIFIED_COLD,
)
from kdabench.sweep.state import ArmState

UNVERIFIED = "unverified"
NOT_VERIFIED = "cold by construction (unique from the first token), not verified by the server"


def unverified(case: dict[str, Any]) -> bool:
    """True for a case that neither passed nor failed: the server gave no evidence."""
    return case.get("verdict") == "skip" and case.get("status") == UNVERIFIED


def case_ok(case: dict[str, Any]) -> bool:
    """True for a case that passed or is unverified (nothing in it failed)."""
    return case.get("verdict") == "pass" or unverified(case)


def unverified_arms(cases: list[dict[str, Any]]) -> list[str]:
    """Arms with an unverified case, in receipt order."""
    return list(dict.fromkeys(case["arm"] for case in cases if unverified(case)))


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
                "failed": len(state.failed_samples.get(size, [])),
                "rate_tok_s": _rate(tokens, median_ms),
                "status": ("failed" if state.failure else
                           "not activated" if state.activation_status == "failed" else
                           UNVERIFIED if _unknown_count(state.samples.get(size, [])) else ""),
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
        cases.append(_probe_case(arm, state.probe))
    for size in options.prompt_tokens:
        samples = state.samples.get(size, [])
        discarded = state.discarded.get(size, [])
        failed = state.failed_samples.get(size, [])
        warmups = state.warmups.get(size, [])
        if not samples and not discarded and not failed and not warmups:
            continue
        ttfts = [r["ttft_ms"] for r in samples]
        median_ms = stats.median(ttfts)
        interval = stats.bootstrap_ci(ttfts, seed=options.seed + index * 1009 + size)
        ci = None if interval is None else list(interval)
        tokens = _median_tokens(samples, size)
        verdict, message = _cold_verdict(state, options, samples, discarded, failed)
        if invalid:
            verdict, message = "fail", flag["message"]
        status = {"status": UNVERIFIED} if verdict == "skip" else {}
        cases.append({
            "id": f"cold/{arm}/{size}", "kind": "cold-ttft", "arm": arm,
            "prompt_tokens_requested": size, "prompt_tokens": tokens,
            "samples_ms": ttfts, "median_ms": median_ms, "ci95_ms": ci,
            "min_ms": min(ttfts, default=None), "max_ms": max(ttfts, default=None),
            "n": len(ttfts), "rate_tok_s": _rate(tokens, median_ms),
            "rate_ci95_tok_s": (None if ci is None or tokens is None else
                                [_rate(tokens, ci[1]), _rate(tokens, ci[0])]),
            "samples": samples, "discarded": discarded, "failed_samples": failed,
            "cache_evidence": _evidence_counts(samples + discarded),
            "warmups_ms": [r["ttft_ms"] for r in warmups], "warmups": warmups,
            "activation": activation, **flag, "verdict": verdict, **status,
            "message": message,
        })
    for total in dict.fromkeys(r["total_tokens"] for r in state.shared_prefix):
        cases.append(_shared_prefix_case(state, total, flag, options.seed + index * 1009))
    if state.decode is not None:
        decode_ok = bool(state.decode["output_tokens"])
        cases.append({
            "id": f"decode/{arm}", "kind": "decode", "arm": arm, **state.decode,
            "activation": activation, **flag,
            "verdict": "pass" if decode_ok and not invalid else "fail",
            "message": flag.get("message", "" if decode_ok else "no tokens in the window"),
        })
    return cases


def _shared_prefix_case(state: ArmState, total: int, flag: dict[str, Any],
                        seed: int) -> dict[str, Any]:
    """One shared-prefix case of an arm: P1 and P2 TTFTs over its repeats, P2's interval."""
    arm, records = state.arm.name, [r for r in state.shared_prefix if r["total_tokens"] == total]
    p2 = [r["p2_ttft_ms"] for r in records if r["p2_ttft_ms"] is not None]
    p1 = [r["p1_ttft_ms"] for r in records if r["p1_ttft_ms"] is not None]
    cached = [r["p2_cached_tokens"] for r in records]
    warmups = [r for r in state.shared_prefix_warmups if r["total_tokens"] == total]
    interval = stats.bootstrap_ci(p2, seed=seed + total)
    return {
        "id": f"shared-prefix/{arm}/{total}", "kind": "shared-prefix", "arm": arm,
        "total_tokens": total, "shared_tokens": records[0]["shared_tokens"],
        "p1_ttft_ms": p1, "p2_ttft_ms": p2, "p2_median_ms": stats.median(p2),
        "p2_ci95_ms": None if interval is None else list(interval),
        "p1_median_ms": stats.median(p1), "p2_cached_tokens": cached,
        "samples": records, "warmups": warmups,
        "warmup_p2_ttft_ms": [r["p2_ttft_ms"] for r in warmups],
        "activation": state.activation_status, **flag,
        "verdict": "fail" if not flag["valid"] or not p2 else "pass",
        "message": flag.get("message", f"P2 cached tokens {cached}"
                            if any(c is not None for c in cached)
                            else "P2 cached tokens not reported by the server"),
    }


def _probe_case(arm: str, probe: dict[str, Any]) -> dict[str, Any]:
    """The probe case: fail on a failed check, else unverified on an undecided one."""
    checks = probe["checks"]
    failed = [name for name, ok in checks.items() if ok is False]
    undecided = [name for name, ok in checks.items() if ok == UNVERIFIABLE]
    verdict, status, message = "pass", {}, "passed"
    if failed:
        verdict, message = "fail", f"failed: {', '.join(failed)}"
    elif undecided:
        verdict, status = "skip", {"status": UNVERIFIED}
        message = (f"unverifiable: {', '.join(undecided)} (the server reports no cached "
                   "tokens, in usage or /metrics); the other checks passed")
    return {"id": f"probe/{arm}", "kind": "probe", "arm": arm, "verdict": verdict, **status,
            "message": message, **probe}


def _cold_verdict(state: ArmState, options: SweepOptions, samples: list[dict[str, Any]],
                  discarded: list[dict[str, Any]],
                  failed: list[dict[str, Any]]) -> tuple[str, str]:
    """(verdict, message) of one cold-TTFT case; "skip" means unverified."""
    if failed:
        reasons = "; ".join(dict.fromkeys(r["failure"] for r in failed))
        return "fail", (f"{len(failed)} sample(s) failed, their streams cut short ({reasons}); "
                        f"{len(samples)} counted")
    if discarded:
        return "fail", (f"{len(discarded)} sample(s) found cached or empty and discarded; "
                        f"{len(samples)} counted")
    if len(samples) < options.samples:
        return ("error" if state.failure else "fail"), \
            f"{len(samples)} of {options.samples} samples taken"
    unknown = _unknown_count(samples)
    if unknown:
        return "skip", (f"{UNVERIFIED}: {len(samples)} cold samples, {unknown} of them "
                        f"{NOT_VERIFIED}")
    return "pass", f"{len(samples)} cold samples, verified cold by the server"


def _evidence_counts(records: list[dict[str, Any]]) -> dict[str, int]:
    """How many timed samples (kept or discarded) had each cache state."""
    return {state: sum(r.get("cache_evidence") == state for r in records)
            for state in (VERIFIED_COLD, VERIFIED_CACHED, UNKNOWN)}


def _unknown_count(samples: list[dict[str, Any]]) -> int:
    return sum(r.get("cache_evidence") == UNKNOWN for r in samples)


def _rate(tokens: float | None, median_ms: float | None) -> float | None:
    if tokens is None or not median_ms:
        return None
    return tokens / (median_ms / 1000.0)


def _median_tokens(samples: list[dict[str, Any]], fallback: int) -> float | None:
    counts = [r["prompt_tokens"] for r in samples if r.get("prompt_tokens") is not None]
    if not samples:
        return None
    return stats.median(counts) if counts else float(fallback)


def block_cases(states: list[ArmState], options: SweepOptions) -> list[dict[str, Any]]:
    """The blocks schedule's ``block-drift`` cases, one per arm and prompt size: each block's
    median TTFT, the drift between the arm's blocks (largest over smallest block median)
    beside the arm's difference from the first arm (its median over the first arm's), and
    whether that difference is within the drift. They report; their verdict is pass."""
    cases = []
    for size in options.prompt_tokens:
        timed = [(state.arm.name, _timed(state, size)) for state in states]
        timed = [(arm, samples) for arm, samples in timed if samples]
        if timed:
            first = (timed[0][0], stats.median([r["ttft_ms"] for r in timed[0][1]]))
            cases.extend(_block_case(arm, size, samples, first) for arm, samples in timed)
    return cases


def _timed(state: ArmState, size: int) -> list[dict[str, Any]]:
    return [r for r in state.samples.get(size, []) if r.get("ttft_ms") is not None]


def _block_case(arm: str, size: int, samples: list[dict[str, Any]],
                first: tuple[str, float]) -> dict[str, Any]:
    blocks: dict[int, list[float]] = {}
    for record in samples:
        blocks.setdefault(record["block"], []).append(record["ttft_ms"])
    medians = {block: stats.median(ttfts) for block, ttfts in blocks.items()}
    drift = max(medians.values()) / min(medians.values())
    versus = stats.median([r["ttft_ms"] for r in samples]) / first[1]
    within = abs(versus - 1.0) <= drift - 1.0
    listed = ", ".join(f"{median:.1f}" for median in medians.values())
    return {
        "id": f"blocks/{arm}/{size}", "kind": "block-drift", "arm": arm,
        "prompt_tokens_requested": size,
        "blocks": [{"block": block, "n": len(blocks[block]), "median_ms": median}
                   for block, median in medians.items()],
        "drift_ratio": drift, "first_arm": first[0], "vs_first_arm_ratio": versus,
        "difference_within_drift": within, "verdict": "pass",
        "message": (f"block medians {listed} ms: drift x{drift:.3f}; vs {first[0]} "
                    f"x{versus:.3f}" + (" (within the drift)" if within else "")),
    }
