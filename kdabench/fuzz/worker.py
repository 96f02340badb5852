"""One worker process of a parallel fuzz campaign: fuzzes one backend from its own seed and
writes what it found as JSON (kdabench.fuzz.parallel starts it; nothing here goes through
the CLI).

    python -m kdabench.fuzz.worker --tier gpu --backend triton --seed 3000000 \\
        --count 1250 [--seconds 60] --tag w4 --findings <folder> --result <file.json> \\
        --warm-part 4/8

Prints "warm" after its part of the warm-up and waits for a line on stdin (so that no
worker's clock starts while another still compiles), then "sets N" as it goes. Exit 0 when the campaign ran (whatever it found; the result file
says), 2 for arguments that do not describe a run (one line).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

PROGRESS_EVERY = 50  # sets between two progress lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kdabench.fuzz.worker",
                                     description="Fuzz one backend in one worker process.")
    parser.add_argument("--tier", required=True, choices=("cpu", "gpu"),
                        help="gpu: GPU limits, kernels warmed up; cpu: the interpreter")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--seed", required=True, type=int)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--tag", required=True, help="prefix of this worker's finding files")
    parser.add_argument("--findings", required=True, help="folder for shrunk findings")
    parser.add_argument("--result", required=True, help="JSON file for the worker's result")
    parser.add_argument("--warm-part", default="0/1", metavar="I/N",
                        help="warm up every N-th kernel specialisation from I, print 'warm', "
                        "and wait for a line on stdin before the timed sets")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.count is None and args.seconds is None:
        print("error: give --count or --seconds", file=sys.stderr)
        return 2
    from kdabench.fuzz.parallel import worker_limits
    from kdabench.fuzz.run import CPU_LIMITS, GPU_LIMITS, Campaign
    from kdabench.qualify import QualifyError, prepare_tier

    try:
        device = prepare_tier(args.tier)
    except QualifyError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    gpu = args.tier == "gpu"
    index, parts = (int(n) for n in args.warm_part.split("/"))

    def warm() -> None:
        print("warm", flush=True)
        sys.stdin.readline()  # the parent answers once every worker is warm

    campaign = Campaign([args.backend], args.seed, args.count, args.seconds, device,
                        worker_limits(GPU_LIMITS if gpu else CPU_LIMITS, index),
                        findings_dir=Path(args.findings),
                        warm=gpu, finding_tag=args.tag, warm_part=(index, parts),
                        on_warm=warm)

    def progress(_backend: str, done: int) -> None:
        if done % PROGRESS_EVERY == 0:
            print(f"sets {done}", flush=True)

    run = campaign.run_backend(args.backend, progress)
    print(f"sets {run.sets}", flush=True)
    Path(args.result).write_text(json.dumps(run.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
