"""What a sweep cannot do, refused as bad input before any request is sent.

A server takes at most ``max_model_len`` tokens per request, prompt and answer together
(vLLM lists it in ``/v1/models`` and ``/tokenize``; the embedded server's limit is the
one the sweep starts it with). A sweep asking for more would see its first long request
refused mid-run; :func:`check_context` refuses it up front.

A server the sweep attaches to runs with the settings it was started with: arms that
differ in server settings (env or args) cannot share one, or every arm would measure the
same server under different names; :func:`check_attached_arms` refuses that.
"""

from __future__ import annotations

from kdabench.sweep.arms import Arm, ArmsFile
from kdabench.sweep.options import MIN_PROMPT_TOKENS, SweepError, SweepOptions
from kdabench.sweep.phases import PROBE_FILL_TOKENS, SAMPLE_MAX_TOKENS


def context_needs(options: SweepOptions) -> list[tuple[str, int, int]]:
    """Each kind of request the sweep sends, as (the option that sizes its prompt, its
    value, the further tokens the request takes), the measured prompt sizes first."""
    probe_extension = max(options.probe_tokens // 2, PROBE_FILL_TOKENS + 1)
    return [
        *(("--prompt-tokens", size, SAMPLE_MAX_TOKENS)
          for size in sorted(options.prompt_tokens, reverse=True)),
        ("probe prompt tokens", options.probe_prompt_size,
         probe_extension + options.probe_tokens),
        *(("--shared-prefix", total, SAMPLE_MAX_TOKENS) for total, _ in options.shared_prefix_runs),
        ("decode prompt tokens", options.decode_prompt_tokens, options.decode_max_tokens),
    ]


def check_context(options: SweepOptions, limit: int, server: str) -> None:
    """SweepError naming the first request that does not fit ``limit`` tokens of context."""
    for option, value, further in context_needs(options):
        if value + further > limit:
            fits = limit - further
            raise SweepError(
                f"{option} {value}: a request would need {value + further} tokens (prompt and "
                f"answer) and {server} takes at most {limit} (its max_model_len)"
                + (f"; give at most {fits}" if fits >= MIN_PROMPT_TOKENS else ""))


def check_attached_arms(arms: ArmsFile, endpoint: str | None) -> None:
    """SweepError when arms that share an attached server differ in env or args."""
    for url, group in endpoint_groups(arms, endpoint).items():
        if len({_server_settings(arms, arm) for arm in group}) > 1:
            names = ", ".join(arm.name for arm in group)
            raise SweepError(
                f"arms {names} differ in server settings (env or args) but share the server "
                f"at {url}, which kdabench did not start and cannot reconfigure; give "
                "--launch CMD to start a server per arm, one arm per endpoint (endpoint = ... "
                "in the arms file), or --schedule blocks --launch CMD to run one server at a "
                "time")


def endpoint_groups(arms: ArmsFile, endpoint: str | None) -> dict[str, list[Arm]]:
    """Attached servers' URLs, each with the arms measured on it."""
    groups: dict[str, list[Arm]] = {}
    for arm in arms.arms:
        groups.setdefault((arm.endpoint or endpoint or "").rstrip("/"), []).append(arm)
    return groups


def _server_settings(arms: ArmsFile, arm: Arm) -> tuple[frozenset, tuple[str, ...]]:
    """What only a server the sweep starts can apply: the arm's env and args."""
    return frozenset(arms.arm_env(arm).items()), tuple(arms.arm_args(arm))
