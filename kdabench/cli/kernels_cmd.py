"""`kdabench kernels`: what the kernel backends can do on the device in hand."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import click

from kdabench.cli.errors import InternalError, user_errors

# Rows of the tables, in order: key -> label. Keys a report adds later are shown after
# these under their own names, so a new field never goes missing from the table.
DEVICE_ROWS = {
    "kind": "kind",
    "device": "device",
    "name": "name",
    "compute_capability": "compute capability",
    "sm_count": "SMs",
    "total_memory_bytes": "memory",
    "driver_version": "driver",
    "cuda_runtime_version": "CUDA (torch build)",
    "uuid": "uuid",
    "cpu_model": "host CPU",
    "cpu_count": "host CPUs usable",
}
SUPPORT_ROWS = {
    "backend": "backend",
    "device": "device",
    "eligible": "eligible",
    "reasons": "reasons",
    "interpreter": "Triton interpreter",
    "capacities": "checkpoint capacities",
    "head_dims": "head dims (K = V)",
    "gate_modes": "gate modes",
    "index_dtypes": "slot index dtypes",
    "chunk_size": "chunk size (tokens)",
    "min_lower_bound": "lowest gate lower bound",
    "shared_memory_budget_bytes": "shared memory budget (heuristic configs)",
    "shared_memory_per_block_bytes": "shared memory per block (GPU limit)",
    "cute_eligible": "cute backend eligible",
    "cute_kernels": "cute kernels",
    "qualified": "qualified (results/)",
    "qualification": "qualification",
}


@click.group()
def kernels() -> None:
    """Inspect the kernel backends: what they support on the device in hand."""


@kernels.command()
@click.option(
    "--device",
    metavar="DEV",
    default=None,
    help="Torch device to describe: 'cpu', 'cuda' or 'cuda:N'. Default: the current "
    "CUDA device when there is one, else the CPU.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def info(device: str | None, as_json: bool) -> None:
    """Show the backend(s), the device in hand and what the plan supports on it."""
    from kdabench.environment import device_identity, toolchain

    with user_errors(ValueError):
        identity = device_identity(device)
    support = _with_qualification(_support_report_function()(identity["device"]))
    versions = toolchain()

    if as_json:
        document = {"device_identity": identity, "support": support, "toolchain": versions}
        click.echo(json.dumps(document, indent=2, default=str))
        return
    _render(identity, support, versions)


def _with_qualification(support: Any) -> Any:
    """The support report(s) with the device's qualification status for each backend."""
    from kdabench.receipts.qualified import device_status

    if isinstance(support, list):
        return [_with_qualification(report) for report in support]
    status = device_status(support["device"], support["backend"])
    return {**support, "qualified": status.qualified, "qualification": status.reason}


def _support_report_function() -> Callable[[str | None], Any]:
    """`kdabench.kernels.support_report`, looked up at call time (tests may replace it)."""
    import kdabench.kernels as kernel_package

    report = getattr(kernel_package, "support_report", None)
    if report is None:
        try:
            from kdabench.kernels.support import support_report as report
        except ImportError as error:
            raise InternalError(
                "kdabench.kernels.support_report is missing from this install"
            ) from error
    return report


def _render(identity: Mapping[str, Any], support: Any, versions: Mapping[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    reports = support if isinstance(support, list) else [support]

    names: list[str] = []
    for report in reports:
        for name in report.get("backends") or [report.get("backend", "?")]:
            if str(name) not in names:
                names.append(str(name))
    backends = ", ".join(names)
    console.print(f"[bold]kdabench kernels[/bold]  backend(s): {backends}")

    device_table = Table(title="Device in hand", title_justify="left", show_header=False)
    device_table.add_column("field", style="bold")
    device_table.add_column("value")
    for label, value in _rows(identity, DEVICE_ROWS):
        device_table.add_row(label, value)
    console.print(device_table)

    for report in reports:
        title = (
            f"{report.get('backend', '?')} backend on {report.get('device', identity['device'])}"
        )
        support_table = Table(title=title, title_justify="left", show_header=False)
        support_table.add_column("field", style="bold")
        support_table.add_column("value")
        for label, value in _rows(report, SUPPORT_ROWS):
            support_table.add_row(label, value)
        console.print(support_table)

    shown = [f"{name} {version}" for name, version in versions.items() if version is not None]
    missing = [name for name, version in versions.items() if version is None]
    line = "toolchain: " + ", ".join(shown)
    if missing:
        line += "  (not installed: " + ", ".join(missing) + ")"
    console.print(line, style="dim", markup=False)


def _rows(record: Mapping[str, Any], labels: Mapping[str, str]) -> list[tuple[str, Any]]:
    """(label, rendered value) for the known keys in order, then any others."""
    keys = [key for key in labels if key in record]
    keys += [key for key in record if key not in labels]
    return [(labels.get(key, key), _render_value(key, record[key])) for key in keys]


def _render_value(key: str, value: Any) -> Any:
    from rich.text import Text

    if key in ("eligible", "qualified") and isinstance(value, bool):
        return Text("yes", style="bold green") if value else Text("no", style="bold red")
    if key == "reasons" and isinstance(value, list | tuple):
        return Text("\n".join(str(reason) for reason in value) if value else "-")
    if value is None:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value} ({_human_bytes(value)})"
    if isinstance(value, list | tuple):
        return Text(", ".join(str(item) for item in value))
    return Text(str(value))


def _human_bytes(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    size = count / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.1f} {unit}"
