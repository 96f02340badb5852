"""Every committed case (tests/fuzz/cases/, written by `kdabench fuzz --corpus`) replays and
passes: one per fault class and a valid one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdabench.fuzz import FAULT_CLASSES, load_case, replay

CASES = sorted((Path(__file__).parent / "cases").glob("*.json"))


def test_the_corpus_holds_every_fault_class_and_a_valid_case():
    assert {path.stem for path in CASES} == {*FAULT_CLASSES, "valid"}
    for path in CASES:
        _, _, fset = load_case(path)
        assert fset.faults == ([] if path.stem == "valid" else [path.stem])


@pytest.mark.interpreter
@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_replays_and_passes(path: Path):
    result = replay([path], torch.device("cpu"))[0].result
    assert result.ok, result.failures
    assert (result.code == 0) == (path.stem == "valid")
