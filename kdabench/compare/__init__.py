"""Compare two sets of receipts case by case: is HEAD slower, faster, or broken?

BASE and HEAD are receipt files or folders of them (every ``*.json`` in a folder, not
recursive). Cases are matched by receipt kind, device name and case id. When a kind
was run on exactly one device on each side and the names differ, the two are paired
anyway and a warning says so; otherwise a device present on one side only makes its
cases ``new`` or ``missing``.

Per matched case:

* medians of the raw ``samples_ms`` of each side (``median_ms`` when a side has no
  samples), the ratio HEAD/BASE;
* a two-sided Mann-Whitney U test on the raw samples (``scipy.stats.mannwhitneyu``);
* a percentile bootstrap confidence interval of the ratio of medians (numpy, seeded
  per case id, so a case's interval does not depend on which other cases ran);
* for bench receipts, kdabench's own samples (capacity 4) in a timing mode both sides ran
  (:mod:`kdabench.compare.bench_cases`), each side's fla ratio in the note;
* a verdict, in order of precedence:

  ``failed``     the case passed in BASE and does not pass in HEAD (whatever the timing);
  ``regressed``  ratio > 1 + threshold and p < alpha;
  ``improved``   ratio < 1 - threshold and p < alpha, or it did not pass in BASE and
                 passes in HEAD;
  ``unchanged``  anything else (a case without samples compares correctness only);
  ``new`` / ``missing``  the case is in HEAD only / in BASE only.

``failed`` and ``regressed`` are regressions. Warnings (shown before the table) say
when paired receipts differ in device, toolchain or kernel/oracle source hashes, when a
receipt is partial, or when a case id appears in more than one receipt of a side (the
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
    bootstrap_ratio_ci,
    case_median,
    compare_case,
    finite_samples,
    mann_whitney_p,
    parse_threshold,
)
from kdabench.compare.pairing import (
    HARNESS_ONLY_TOOLCHAIN_KEYS,
    Comparison,
    LoadedReceipt,
    compare_paths,
    compare_receipts,
    load_receipts,
)
from kdabench.compare.render import (
    format_interval,
    format_ms,
    format_p,
    format_ratio,
    render_markdown,
)

__all__ = [
    "HARNESS_ONLY_TOOLCHAIN_KEYS", "REGRESSIONS", "VERDICTS", "CaseComparison", "CompareError",
    "CompareOptions", "Comparison", "LoadedReceipt", "bootstrap_ratio_ci", "case_median",
    "compare_case", "compare_paths", "compare_receipts", "finite_samples", "format_interval",
    "format_ms", "format_p", "format_ratio", "load_receipts", "mann_whitney_p",
    "parse_threshold", "render_markdown",
]
