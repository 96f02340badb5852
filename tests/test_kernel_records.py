"""kdabench.kernel_records: what a receipt says of the kernel a case ran with."""

from __future__ import annotations

import dataclasses

import pytest

from kdabench.kernel_records import plan_record
from kdabench.kernels import Caps, KernelConfig, plan


def planned(max_tokens: int, max_seqs: int, pipeline: str):
    caps = Caps(device="cpu", num_heads=1, head_dim=64, max_tokens=max_tokens,
                max_seqs=max_seqs, max_state_slots=4, max_checkpoints=4)
    return plan(caps, KernelConfig(chunk_size=64, block_v=16, pipeline=pipeline))


@pytest.mark.parametrize("max_tokens, max_seqs, ranges", [
    (9000, 1, {"eager": 1, "graph": 2}),     # 142 chunk slots
    (40000, 1, {"eager": 2, "graph": 8}),    # 626: capped at 8 ranges
    (40000, 64, {"eager": 1, "graph": 1}),   # 689 slots over 64 sequences
])
def test_split_plans_record_their_ranges(max_tokens, max_seqs, ranges):
    p = planned(max_tokens, max_seqs, "split")
    assert plan_record(p) == {"kernel_config": dataclasses.asdict(p.config),
                              "config_source": "explicit", "policy_mode": p.policy_mode,
                              "backend": "triton", "split_ranges": ranges}


def test_fused_plans_record_no_ranges():
    assert "split_ranges" not in plan_record(planned(40000, 1, "fused"))
