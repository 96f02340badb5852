"""One worker process of a parallel qualification: runs its part of the cases and writes its
receipt (kdabench.qualify.parallel starts it; nothing here goes through the CLI).

    python -m kdabench.qualify.worker --tier gpu --backend triton --part 2/8 \\
        --cases 3,17,42 --out <folder> [--matrix FILE] [--filter SUBSTR]

Prints one line per finished case. Exit 0 when every case passes, 1 when one fails or errors
(the receipt is complete either way), 2 for arguments that do not describe a run (one line).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kdabench.qualify.worker",
                                     description="Run one part of a qualification.")
    parser.add_argument("--tier", required=True, choices=("cpu", "gpu"))
    parser.add_argument("--backend", required=True)
    parser.add_argument("--part", required=True, metavar="I/N",
                        help="which part of the run this is (recorded as the shard)")
    parser.add_argument("--cases", required=True, metavar="I,J,...",
                        help="indices of the cases to run, in the tier's expansion")
    parser.add_argument("--out", required=True, help="folder for the receipt")
    parser.add_argument("--matrix", default=None, help="matrix file (default: the packaged one)")
    parser.add_argument("--filter", dest="contains", default=None)
    return parser


def _progress(record: dict[str, Any]) -> None:
    print(f"{record['verdict']:5} {record['wall_s']:8.2f} s (compile {record['compile_s']:.2f})"
          f"  {record['id']}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from kdabench.matrix import MatrixError, load_matrix, parse_shard
    from kdabench.qualify.run import Qualification, QualifyError
    from kdabench.receipts import ReceiptError

    try:
        cases = [int(index) for index in args.cases.split(",")]
        run = Qualification(load_matrix(args.matrix), tier=args.tier, backend=args.backend,
                            shard=parse_shard(args.part), contains=args.contains,
                            out_dir=args.out, case_indices=cases)
    except (MatrixError, QualifyError, ReceiptError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = run.run(on_case=_progress)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
