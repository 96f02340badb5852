"""Summary of one cosmic-ray session: mutants by outcome, then each survivor's place and diff.

Usage: python .ci/mutation_summary.py SESSION.sqlite (with cosmic-ray's Python: .ci/mutation)
"""

from __future__ import annotations

import sys
from collections import Counter

from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import TestOutcome, WorkerOutcome


def main(session: str) -> int:
    """Print the counts and the survivors; 0 when every mutant ran."""
    with use_db(session, WorkDB.Mode.open) as db:
        done = list(db.completed_work_items)
        pending = sum(1 for _ in db.pending_work_items)
    outcomes: Counter[str] = Counter()
    survivors = []
    for item, result in done:
        if result.worker_outcome == WorkerOutcome.SKIPPED:
            outcomes["skipped (filtered operator)"] += 1
        elif result.test_outcome is None:
            outcomes[f"no test outcome ({result.worker_outcome.value})"] += 1
        else:
            outcomes[result.test_outcome.value] += 1
            if result.test_outcome == TestOutcome.SURVIVED:
                survivors.append((item, result))
    ran = outcomes[TestOutcome.KILLED.value] + len(survivors)
    print(f"{session}: {ran} mutants ran, {outcomes[TestOutcome.KILLED.value]} killed, "
          f"{len(survivors)} survived; " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items())
                                                     if k not in ("killed", "survived"))
          + (f"; {pending} pending" if pending else ""))
    survivors.sort(key=lambda pair: (pair[0].mutations[0].start_pos,
                                     pair[0].mutations[0].operator_name))
    for item, result in survivors:
        mutation = item.mutations[0]
        line, column = mutation.start_pos
        changed = [d for d in (result.diff or "").splitlines()
                   if d[:1] in "+-" and not d.startswith(("+++", "---"))]
        print(f"  SURVIVED {mutation.module_path}:{line}:{column} {mutation.operator_name}")
        for d in changed:
            print(f"      {d}")
    return 1 if pending else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
