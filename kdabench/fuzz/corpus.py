"""A seed corpus: one small case per fault class (that class alone) and a valid one."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from kdabench.fuzz.cases import Rigs, Shape, case_document, write_case
from kdabench.fuzz.check import default_target, run_set
from kdabench.fuzz.classes import FAULT_CLASSES
from kdabench.fuzz.generate import Limits, faulty_set, valid_set

CORPUS_LIMITS = Limits(heads=1, head_dim=64, max_seqs=3, max_len=20, valid_share=0.0)


def write_corpus(folder: Path, backend: str, seed: int, device: torch.device
                 ) -> tuple[list[Path], list[Path]]:
    """Write `valid.json` and `<fault class>.json`; returns (written, those failing here)."""
    rng = random.Random(seed)
    rigs, target = Rigs(device), default_target()
    sets = {"valid": valid_set(CORPUS_LIMITS, 2, rng)}
    sets.update({name: faulty_set(CORPUS_LIMITS, [name], rng) for name in FAULT_CLASSES})
    written, failing = [], []
    for name, fset in sets.items():
        shape = Shape(CORPUS_LIMITS, fset.capacity, seed)
        result = run_set(rigs.get(backend, shape), fset, target)
        path = write_case(folder / f"{name}.json", case_document(backend, shape, fset, result))
        written.append(path)
        if not result.ok:
            failing.append(path)
    return written, failing
