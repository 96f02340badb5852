"""Every case of every receipt as one tidy table (a pandas DataFrame): one row per case per
receipt, the same columns for every kind (``COLUMNS``; a field a kind lacks is empty).

    from kdabench.report import report_table

    table = report_table(["results/"])          # pandas.DataFrame, columns COLUMNS
    table[table.kind == "qualify"].groupby("backend").median_ms.median()

Columns:

``receipt``      the receipt's file name (as listed in the folder given): never a full path
``kind``         qualify, bench, serve-sweep, ...
``backend``      the kernel backend (a bench receipt's first; empty for serve-sweep)
``device``       the device's name
``verified``     whether the receipt verifies (hash, rendering, summary)
``case``         the case id
``verdict``      pass, fail, error or skip
``scenario``     qualify: the scenario; serve-sweep: the case's kind (cold-ttft, decode, ...)
``arm``          serve-sweep: the arm
``kernel``       bench: the kernel timed (kdabench at capacity 4 on the first backend; a case
                 that times one kernel: that kernel)
``mode``         bench: the timing mode of the samples (the case's primary mode)
``gates``        bench: the gate regime of the case's inputs (long-memory, fast-decay, ...)
``tokens``       qualify ``shape.tokens`` (``shape.max_tokens``); bench ``T``
``seqs``         qualify ``shape.num_seqs``; bench ``seqs``
``heads``        qualify ``params.heads``; bench ``H``
``head_dim``     qualify ``params.head_dim``; bench ``K``
``prompt_tokens``  serve-sweep: the prompt size asked for (else the one the case records)
``median_ms``    the median of the samples, else the median the case records
``ci_low_ms``, ``ci_high_ms``  the seeded percentile bootstrap 95% interval of the median of
                 the samples (:func:`kdabench.stats.bootstrap_ci`, seed 0), computed here
                 from the raw samples whatever interval the receipt records; empty without
                 samples
``n_samples``    the raw samples: qualify and other kinds ``samples_ms``; bench the timed
                 kernel's samples in ``mode``; serve-sweep the TTFT samples of a TTFT case

pandas is imported only when a table is built.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdabench import stats
from kdabench.receipts import LoadedReceipt
from kdabench.report.bench import bench_points
from kdabench.report.build import read_receipts
from kdabench.report.fields import finite_numbers, get_field, to_number
from kdabench.report.serve_sweep import serve_point

if TYPE_CHECKING:
    import pandas

COLUMNS = ("receipt", "kind", "backend", "device", "verified", "case", "verdict", "scenario",
           "arm", "kernel", "mode", "gates", "tokens", "seqs", "heads", "head_dim", "prompt_tokens",
           "median_ms", "ci_low_ms", "ci_high_ms", "n_samples")


def _timing(samples: list[float], recorded: float | None) -> dict[str, Any]:
    """median_ms, the interval and n_samples of raw ``samples`` (``recorded``: the case's
    own median, used when it has no samples)."""
    median = stats.median(samples)
    if median is None and recorded is not None and math.isfinite(recorded):
        median = recorded
    interval = stats.bootstrap_ci(samples)
    return {"median_ms": median, "ci_low_ms": interval[0] if interval else None,
            "ci_high_ms": interval[1] if interval else None, "n_samples": len(samples)}


def _qualify_fields(case: Mapping[str, Any]) -> dict[str, Any]:
    return {"scenario": case.get("scenario"),
            "tokens": to_number(get_field(case, "shape.tokens", "shape.max_tokens")),
            "seqs": to_number(get_field(case, "shape.num_seqs")),
            "heads": to_number(get_field(case, "params.heads")),
            "head_dim": to_number(get_field(case, "params.head_dim")),
            **_timing(finite_numbers(case.get("samples_ms")), to_number(case.get("median_ms")))}


def _bench_fields(case: Mapping[str, Any], kernel: str) -> dict[str, Any]:
    """``kernel``'s timing in the case (a case of one kernel: that kernel's)."""
    points = bench_points(case)
    point = next((p for p in points if p.kernel == kernel),
                 points[0] if len(points) == 1 else None)
    fields = {"kernel": point.kernel if point else None, "mode": case.get("primary_mode"),
              "gates": get_field(case, "gates.name"),
              "tokens": to_number(get_field(case, "T", "tokens", "shape.T", "shape.tokens")),
              "seqs": to_number(get_field(case, "seqs", "num_seqs", "shape.seqs")),
              "heads": to_number(get_field(case, "H", "heads", "shape.H", "shape.heads")),
              "head_dim": to_number(get_field(case, "K", "head_dim", "shape.K"))}
    if point is None:
        return {**fields, **_timing([], None)}
    return {**fields, **_timing(point.samples, point.median_ms)}


def _serve_fields(case: Mapping[str, Any]) -> dict[str, Any]:
    point = serve_point(case)
    return {"scenario": point.kind, "arm": point.arm, "prompt_tokens": point.prompt_tokens,
            **_timing(point.samples, point.median_ms)}


def _other_fields(case: Mapping[str, Any]) -> dict[str, Any]:
    return _timing(finite_numbers(case.get("samples_ms")), to_number(case.get("median_ms")))


def case_rows(receipt: LoadedReceipt) -> list[dict[str, Any]]:
    """The receipt's rows: one per case, keyed by the names of ``COLUMNS``."""
    common = {"receipt": receipt.name, "kind": receipt.kind, "backend": receipt.backend,
              "device": receipt.device_name, "verified": receipt.verified}
    rows = []
    for case in receipt.cases:
        if receipt.kind == "qualify":
            fields = _qualify_fields(case)
        elif receipt.kind == "bench":
            fields = _bench_fields(case, receipt.backend_kernels[str(receipt.backend)])
        elif receipt.kind == "serve-sweep":
            fields = _serve_fields(case)
        else:
            fields = _other_fields(case)
        row = dict.fromkeys(COLUMNS)
        row.update(common, case=str(case.get("id")), verdict=case.get("verdict"), **fields)
        rows.append(row)
    return rows


def cases_table(receipts: Sequence[LoadedReceipt]) -> pandas.DataFrame:
    """One row per case per receipt, columns ``COLUMNS`` (the module docstring)."""
    import pandas

    return pandas.DataFrame([row for receipt in receipts for row in case_rows(receipt)],
                            columns=list(COLUMNS))


def report_table(
    inputs: Iterable[str | Path], *, require_verified: bool = False,
    current_sources: Mapping[str, str] | None = None,
) -> pandas.DataFrame:
    """Read and verify the receipts named by ``inputs`` (files or folders) and tabulate their
    cases (:func:`cases_table`). Raises :class:`~kdabench.report.ReportError` as
    :func:`~kdabench.report.build_report` does."""
    return cases_table(read_receipts(inputs, require_verified=require_verified,
                                     current_sources=current_sources))
