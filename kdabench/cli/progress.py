"""The progress bar shared by commands that run cases one by one and write a receipt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kdabench.cli.errors import UserError, print_error


def run_cases_with_progress(console: Console, run: Any, *, total: int, first: str,
                            label: Callable[[Any], str], receipt: str,
                            artifact: str = "receipt") -> Any:
    """run.run(on_start=, on_case=) under a progress bar; failures printed as they come.

    label: the bar's text for the item starting; receipt: where the (partial) receipt goes,
    named on Ctrl-C (exit 130) and when it cannot be written (exit 2); artifact: what the
    run writes there ("receipt", "profile").
    """
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(first, total=total)

        def on_start(item: Any) -> None:
            progress.update(task, description=escape(label(item)))

        def on_case(record: dict[str, Any]) -> None:
            if record["verdict"] != "pass":
                progress.console.print(f"[red]{record['verdict'].upper()}[/red] "
                                       f"{escape(record['id'])}: {escape(str(record['message']))}")
            progress.advance(task)

        try:
            result = run.run(on_start=on_start, on_case=on_case)
        except KeyboardInterrupt:
            progress.stop()
            print_error(f"interrupted: the partial {artifact} is {receipt}",
                        style="bold yellow")
            raise click.exceptions.Exit(130) from None
        except OSError as error:
            raise UserError(f"cannot write the {artifact} {receipt}: "
                            f"{error.strerror or error}") from error
        progress.update(task, description="done")
    return result
