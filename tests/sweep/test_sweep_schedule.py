"""`serve-sweep --schedule blocks`: one server at a time, its own per block, A B B A."""

from __future__ import annotations

import itertools
import json
import socket
import sys
from pathlib import Path

import pytest
import sweep_fake_server as fake
from click.testing import CliRunner
from fake_arms import TWO_ARMS, run_sweep

from kdabench.cli.main import cli
from kdabench.receipts import verify_file
from kdabench.sweep.arms import parse_arms
from kdabench.sweep.options import SweepError, SweepOptions
from kdabench.sweep.runner import block_order
from kdabench.sweep.state import ArmState

LAUNCH = f"{sys.executable} {Path(fake.__file__).resolve()}"

def sweep(tmp_path: Path, *args: str):
    return run_sweep(tmp_path, TWO_ARMS, *args)


def port_closed(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, int(port))) != 0


def test_blocks_run_a_b_b_a_in_passes_that_alternate_direction() -> None:
    arms = parse_arms(TWO_ARMS + '\n[[arms]]\nname = "third"\n')
    a, b, c = (ArmState(arm=arm, server=None) for arm in arms.arms)
    assert block_order([a, b], 2) == [a, b, b, a]
    assert block_order([a, b], 3) == [a, b, b, a, a, b]
    assert block_order([a, b, c], 2) == [a, b, c, c, b, a]


def test_blocks_start_a_server_per_block_and_keep_each_blocks_samples(tmp_path: Path) -> None:
    result, receipts = sweep(tmp_path, "--schedule", "blocks", "--launch", LAUNCH)
    assert result.exit_code == 0, result.output
    receipt = json.loads(receipts[0].read_text())
    assert verify_file(receipts[0]).ok and receipt["status"] == "complete"
    assert receipt["config"]["options"]["schedule"] == "blocks"

    blocks = receipt["config"]["blocks"]
    assert [(b["block"], b["arm"]) for b in blocks] == [
        (0, "cache-on"), (1, "cache-off"), (2, "cache-off"), (3, "cache-on")]
    servers = [b["server"] for b in blocks]
    assert len({s["pid"] for s in servers}) == 4 and len({s["url"] for s in servers}) == 4
    for earlier, later in itertools.pairwise(blocks):  # one server at a time
        assert earlier["stopped_at"] <= later["started_at"]
    for block in blocks:
        assert block["started_at"] <= block["healthy_at"] <= block["stopped_at"]
        assert port_closed(block["server"]["url"])
        log = Path(block["server"]["log"])
        assert log.name == f"{block['arm']}-block{block['block']}.log"
        assert log.read_text().startswith("fake: listening")

    cases = {case["id"]: case for case in receipt["cases"]}
    assert all(case["verdict"] == "pass" for case in receipt["cases"]), result.output
    for arm, arm_blocks in (("cache-on", [0, 3]), ("cache-off", [1, 2])):
        for size in (64, 128):
            samples = cases[f"cold/{arm}/{size}"]["samples"]
            assert [(s["block"], s["arm"]) for s in samples] == [
                (b, arm) for b in arm_blocks for _ in range(2)]  # --samples per block
            drift = cases[f"blocks/{arm}/{size}"]
            assert drift["kind"] == "block-drift"
            assert [b["block"] for b in drift["blocks"]] == arm_blocks
            assert [b["n"] for b in drift["blocks"]] == [2, 2]
            medians = [b["median_ms"] for b in drift["blocks"]]
            assert drift["drift_ratio"] == pytest.approx(max(medians) / min(medians))
            assert drift["first_arm"] == "cache-on"
    assert cases["blocks/cache-on/64"]["vs_first_arm_ratio"] == pytest.approx(1.0)
    assert cases["server/cache-on"]["activation"] == "passed"  # probes in the last block,
    assert cases["shared-prefix/cache-on/64"]["p2_cached_tokens"] == [32]  # shared prefix last
    assert [w["p2_cached_tokens"] for w in cases["shared-prefix/cache-on/64"]["warmups"]] == [32]


def test_blocks_need_a_server_the_sweep_starts(tmp_path: Path) -> None:
    result, receipts = sweep(tmp_path, "--schedule", "blocks", "--endpoint",
                             "http://127.0.0.1:9")
    assert result.exit_code == 2 and not receipts
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--schedule blocks starts a server for every block" in lines[0]


def test_schedule_and_blocks_are_checked() -> None:
    with pytest.raises(SweepError, match="schedule 'round-robin' is not one of"):
        SweepOptions(schedule="round-robin").validate()
    with pytest.raises(SweepError, match="blocks must be at least 1"):
        SweepOptions(schedule="blocks", blocks=0).validate()
    result = CliRunner().invoke(cli, ["serve-sweep", "--help"], prog_name="kdabench")
    assert "--schedule [interleaved|blocks]" in result.stdout and "A B B A" in result.stdout
