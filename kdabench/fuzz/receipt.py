"""The "fuzz" receipt: the campaign's options, one case per backend, findings beside it."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from kdabench.fuzz.parallel import fuzz_backend
from kdabench.fuzz.run import BackendRun, Campaign
from kdabench.receipts import free_receipt_path, new_receipt, receipt_dir


def run_campaign(campaign: Campaign, *, out_dir: str | os.PathLike | None = None,
                 command_line: Sequence[str] | None = None,
                 on_progress: Callable[[str, int], None] | None = None
                 ) -> tuple[list[BackendRun], Path]:
    """Run every backend of the campaign; findings go to `<receipt>-findings/` beside the
    receipt, which is written as backends finish (partial if interrupted)."""
    from kdabench.environment import device_identity

    builder = new_receipt("fuzz", config=campaign.config(), command_line=command_line,
                          device=device_identity(str(campaign.device)))
    path = free_receipt_path(receipt_dir(out_dir), builder.filename())
    campaign = replace(campaign, findings_dir=path.with_name(f"{path.stem}-findings"))
    runs = []
    with builder.writer(path) as receipt:
        for backend in campaign.backends:
            runs.append(fuzz_backend(campaign, backend, on_progress))
            receipt.add_case(runs[-1].record())
    return runs, path
