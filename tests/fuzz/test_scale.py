"""The CPU acceptance: 2,000 sets under the interpreter in under two minutes, every fault
class drawn at least 100 times, nothing failing; in as many worker processes as `kdabench
fuzz` takes by default on this host (one per core, kdabench.fuzz.parallel.cpu_workers)."""

from __future__ import annotations

import pytest
import torch

from kdabench.fuzz import CPU_LIMITS, FAULT_CLASSES, Campaign
from kdabench.fuzz.parallel import cpu_workers, fuzz_backend

pytestmark = pytest.mark.interpreter


def test_two_thousand_sets_in_two_minutes(tmp_path):
    campaign = Campaign(["triton"], 0, 2000, None, torch.device("cpu"), CPU_LIMITS,
                        tmp_path, warm=False, workers=cpu_workers())
    done = fuzz_backend(campaign, "triton")
    assert done.ok, done.findings
    assert done.sets == 2000
    assert done.seconds < 120, f"{done.sets} sets took {done.seconds:.1f} s"
    assert set(done.per_class) == set(FAULT_CLASSES)
    assert min(done.per_class.values()) >= 100, done.per_class
