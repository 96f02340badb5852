"""Run one set on a rig and check it.

Valid (the oracle expects code 0): code 0; the output rows of the live tokens, every live
final state and every active checkpoint against the float64 token-by-token recurrence
(relative Frobenius error within the qualification tolerances); every pool slot no live final
or active checkpoint names unchanged bit for bit. Faulty: exactly the oracle's error code, an
all-NaN output, and the whole pool (every slot, named or not) unchanged bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kdabench.fuzz.rig import Rig
from kdabench.fuzz.sets import FuzzSet
from kdabench.matrix import DEFAULT_TOLERANCES
from kdabench.oracles import recurrent_kda, relative_error

VALID_CHECKS = ("error-code", "output", "final-state", "checkpoint", "unnamed-slots-unchanged")
FAULTY_CHECKS = ("error-code", "output-all-nan", "whole-pool-unchanged")
Target = Callable[[object], object]  # a Binding -> a KdaResult (kdabench.kernels.run)


@dataclass
class Failure:
    """One failed check: its name (VALID_CHECKS, FAULTY_CHECKS, or 'bind' / 'run') and why."""

    check: str
    message: str


@dataclass
class SetResult:
    """What one set's run found."""

    expected: int
    code: int | None
    failures: list[Failure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def first(self) -> str | None:
        """The name of the first failed check (what the shrinker keeps failing)."""
        return self.failures[0].check if self.failures else None


def default_target() -> Target:
    from kdabench import kernels

    return kernels.run


def run_set(rig: Rig, fset: FuzzSet, target: Target) -> SetResult:
    """Bind, run and check one set; the rig's pool is put back afterwards."""
    from kdabench.kernels import KdaConfigError

    expected = fset.expected_code()
    result = SetResult(expected, None)
    try:
        binding = rig.bind(fset)
    except KdaConfigError as error:
        result.failures.append(Failure("bind", str(error)))
        return result
    rig.out.fill_(float("nan") if expected == 0 else 0.0)  # what a run must overwrite
    try:
        result.code = int(target(binding).error_code.item())
    except Exception as error:  # noqa: BLE001 - a crash or an out-of-bounds access is a finding
        result.failures.append(Failure("run", f"{type(error).__name__}: {error}"))
    changed = rig.changed_slots()
    if result.code is not None:
        output = rig.out[: fset.tokens]
        if expected:
            _check_faulty(result, output, changed)
        else:
            _check_valid(result, rig, fset, output, changed)
    rig.restore(changed)
    return result


def _check_faulty(result: SetResult, output: torch.Tensor, changed: list[int]) -> None:
    if result.code != result.expected:
        result.failures.append(Failure(
            "error-code", f"error code {result.code}, the oracle expects {result.expected}"))
    if not bool(torch.isnan(output).all()):
        result.failures.append(Failure("output-all-nan", "the output is not all NaN"))
    if changed:
        result.failures.append(Failure(
            "whole-pool-unchanged", f"rejected metadata changed pool slots {changed[:8]}"))


def _check_valid(result: SetResult, rig: Rig, fset: FuzzSet, output: torch.Tensor,
                 changed: list[int]) -> None:
    if result.code:
        result.failures.append(Failure("error-code", f"valid metadata rejected with code "
                                       f"{result.code}"))
        return
    stray = sorted(set(changed) - fset.write_slots())
    if stray:
        result.failures.append(Failure(
            "unnamed-slots-unchanged", f"slots no destination names changed: {stray[:8]}"))
    live = fset.live
    cu = fset.cu_seqlens[: live + 1]
    tokens, x = cu[-1], rig.x_cpu
    ref = recurrent_kda(x.q[:tokens], x.k[:tokens], x.v[:tokens], x.g[:tokens],
                        x.beta[:tokens], cu_seqlens=cu, initial_state=rig.initial_states(fset),
                        prefix_lengths=fset.actives(), device="cpu")
    tol = DEFAULT_TOLERANCES
    if tokens:
        error = relative_error(ref.o, output[:tokens].cpu())
        if not error <= tol["output"]:
            result.failures.append(Failure(
                "output", f"output error {error:.3e} exceeds {tol['output']:.1e}"))
    named = [(f"final state of sequence {n}", "final-state", fset.final[n], ref.final_state[n])
             for n in range(live) if fset.final[n] >= 0]
    named += [(f"checkpoint {i} of sequence {n}", "checkpoint", slot, ref.prefix_states[n][i])
              for n, i, _, slot in fset.active_entries()]
    if not named:
        return
    got = rig.pool[torch.tensor([slot for _, _, slot, _ in named], device=rig.pool.device)].cpu()
    for (what, check, slot, expected), state in zip(named, got, strict=True):
        error = relative_error(expected, state)
        if not error <= tol["state"]:
            result.failures.append(Failure(
                check, f"{what} (slot {slot}): error {error:.3e} exceeds {tol['state']:.1e}"))
