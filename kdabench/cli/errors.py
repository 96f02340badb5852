"""Exit codes and error reporting shared by every `kdabench` command.

A command is a thin shell: it parses, calls a library function and renders. When the
user can fix what went wrong, it raises `UserError` with one sentence that says what to
do; when it finds something (a failed case, a regression) it renders its table first and
then raises `Finding`. Both print one red line on stderr and no traceback. Anything else
that escapes a command is a bug: the top-level group turns it into `InternalError`, and
prints the traceback only under `kdabench --debug`.

    from kdabench.cli.errors import Finding, UserError, user_errors

    with user_errors(MatrixError, FileNotFoundError):   # library errors -> exit 2
        matrix = load_matrix(path)
    ...
    if failed:
        raise Finding(f"{failed} of {total} cases failed")  # exit 1
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import click
from rich.console import Console
from rich.text import Text

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3

#: The exit-code table shown at the end of `kdabench --help`.
EXIT_CODES_HELP = f"""\b
Exit codes:
  {EXIT_OK}  ok
  {EXIT_FINDING}  a finding: a failed case, a regression, a receipt that does not verify
  {EXIT_BAD_INPUT}  bad input: an unknown option, a missing file, metadata the tool refuses
  {EXIT_INTERNAL}  internal error (a bug): rerun with --debug for the traceback
"""


def print_error(message: str, *, style: str = "bold red") -> None:
    """Print `message` as one line on stderr (rich markup in it is not interpreted)."""
    line = " ".join(message.split())  # one line, whatever the message held
    Console(stderr=True, soft_wrap=True, highlight=False).print(Text(line, style=style))


class _OneLineError(click.ClickException):
    prefix = "error"
    style = "bold red"

    def show(self, file: object = None) -> None:
        print_error(f"{self.prefix}: {self.format_message()}", style=self.style)


class UserError(_OneLineError):
    """Bad input the user can fix: one red line on stderr, exit code 2."""

    exit_code = EXIT_BAD_INPUT


class Finding(_OneLineError):
    """The command ran and found something wrong (a failed case, a regression): exit 1.

    Render the details (the table, the receipt path) before raising; the message is the
    one-line verdict.
    """

    exit_code = EXIT_FINDING
    prefix = "finding"


class InternalError(_OneLineError):
    """An unexpected exception escaped a command: a bug in kdabench, exit code 3."""

    exit_code = EXIT_INTERNAL
    prefix = "internal error"

    @classmethod
    def wrap(cls, error: BaseException) -> InternalError:
        return cls(
            f"{type(error).__name__}: {error} (rerun with 'kdabench --debug ...' for the "
            "traceback, and report it)"
        )


def usage_error_as_user_error(error: click.UsageError) -> UserError:
    """Turn click's multi-line usage error into one line that names the help to read."""
    message = error.format_message()
    if error.ctx is not None:
        message = f"{message.rstrip('.')}. See '{error.ctx.command_path} --help'."
    return UserError(message)


@contextlib.contextmanager
def user_errors(*error_types: type[BaseException]) -> Iterator[None]:
    """Report the given library exceptions (default: ValueError) as `UserError`s."""
    reported = error_types or (ValueError,)
    try:
        yield
    except reported as error:
        raise UserError(str(error)) from error
