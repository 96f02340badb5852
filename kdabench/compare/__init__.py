"""Compare two sets of receipts case by case: is HEAD slower, faster, or broken?

BASE and HEAD are receipt files or folders of them (every ``*.json`` in a folder, not
recursive). Cases are paired by receipt kind, kernel backend, device name and case id
(:mod:`kdabench.compare.groups`): a Triton case is never judged against a CuTe case, nor an
H100 case against an H200 one, unless the comparison is asked to go across that field
(``across=("backend",)``, ``("device",)``, or both), which then leaves it out of the key.
A bench receipt that timed several backends holds a part per backend, each judged by its
backend's kernel. On each side, a group's newest receipt wins a case id that several of its
receipts hold. A receipt whose (kind, backend, device) has no counterpart on the other side
is listed as unmatched (``Comparison.unmatched``) and its cases are not compared; which
receipts were paired with which is ``Comparison.pairs``.

Per matched case:

* medians of the raw ``samples_ms`` of each side (``median_ms`` when a side has no
  samples), the ratio HEAD/BASE;
* a two-sided Mann-Whitney U test on the raw samples (:func:`kdabench.stats.mann_whitney_p`,
  scipy imported only when a test runs);
* a percentile bootstrap confidence interval of the ratio of medians
  (:func:`kdabench.stats.bootstrap_ratio_ci`, seeded per case id, so a case's interval does
  not depend on which other cases ran);
* for bench receipts, the samples of the backend's kdabench kernel (capacity 4) in a timing
  mode both sides ran (:mod:`kdabench.compare.bench_cases`), each side's fla ratio in the
  note;
* a verdict, in order of precedence:

  ``failed``     the case passed in BASE and does not pass in HEAD (whatever the timing);
  ``regressed``  ratio > 1 + threshold and p < alpha;
  ``improved``   ratio < 1 - threshold and p < alpha, or it did not pass in BASE and
                 passes in HEAD;
  ``unchanged``  anything else (a case without samples compares correctness only);
  ``new`` / ``missing``  the case is in HEAD only / in BASE only (within a pair).

``failed`` and ``regressed`` are regressions. Warnings (shown before the table) say
when paired receipts differ in device, toolchain or kernel/oracle source hashes, when a
receipt is partial, or when a case id appears in more than one receipt of a group (the
newest receipt wins). A receipt that does not verify is refused (:class:`CompareError`)
unless ``verify=False``, which turns the refusal into a warning.

    comparison = compare_paths("main-results/", "results/", threshold=0.05, alpha=0.01)
    print(render_markdown(comparison))
    if comparison.has_regression: ...
"""

from kdabench.compare.cases import (
    REGRESSIONS,
    VERDICTS,
    CaseComparison,
    CompareError,
    CompareOptions,
    case_median,
    compare_case,
    finite_samples,
    parse_threshold,
)
from kdabench.compare.groups import (
    ACROSS_FIELDS,
    PAIRING_FIELDS,
    GroupKey,
    ReceiptPair,
    UnmatchedReceipt,
    parse_across,
)
from kdabench.compare.pairing import (
    HARNESS_ONLY_TOOLCHAIN_KEYS,
    Comparison,
    compare_paths,
    compare_receipts,
    load_side,
)
from kdabench.compare.render import (
    format_interval,
    format_ms,
    format_p,
    format_ratio,
    has_several_groups,
    pairing_lines,
    render_markdown,
)

__all__ = [
    "ACROSS_FIELDS", "HARNESS_ONLY_TOOLCHAIN_KEYS", "PAIRING_FIELDS", "REGRESSIONS", "VERDICTS",
    "CaseComparison", "CompareError", "CompareOptions", "Comparison", "GroupKey",
    "ReceiptPair", "UnmatchedReceipt", "case_median", "compare_case", "compare_paths",
    "compare_receipts", "finite_samples", "format_interval", "format_ms", "format_p",
    "format_ratio", "has_several_groups", "load_side", "pairing_lines", "parse_across",
    "parse_threshold", "render_markdown",
]
