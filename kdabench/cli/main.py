"""The `kdabench` command: a click group; each sub-command lives in its own module."""

from __future__ import annotations

import traceback
from typing import Any

import click

from kdabench import __version__
from kdabench.cli import (
    bench_cmd,
    build_kernels_cmd,
    compare_cmd,
    fuzz_cmd,
    kernels_cmd,
    merge_cmd,
    qualify_cmd,
    report_cmd,
    reseal_cmd,
    serve_local_cmd,
    serve_sweep_cmd,
    tune_cmd,
    verify_cmd,
)
from kdabench.cli.errors import (
    EXIT_CODES_HELP,
    InternalError,
    usage_error_as_user_error,
)


class KdabenchGroup(click.Group):
    """A click group whose errors are one line, with tracebacks only under --debug."""

    def make_context(self, info_name: str | None, args: list[str], parent=None, **extra: Any):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # bare `kdabench`: click prints the help
        except click.UsageError as error:
            raise usage_error_as_user_error(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            raise usage_error_as_user_error(error) from None
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as error:
            if ctx.params.get("debug"):
                traceback.print_exc()
            raise InternalError.wrap(error) from error


@click.group(
    cls=KdabenchGroup,
    epilog=EXIT_CODES_HELP,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="kdabench")
@click.option(
    "--debug",
    is_flag=True,
    help="Print the full traceback when a command fails unexpectedly.",
)
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """KDA (Kimi Delta Attention) chunked-prefill kernels that export up to four interior
    recurrent-state checkpoints from one prefill, the oracles that prove them right, and
    the harness that qualifies them on a GPU and measures what they buy a serving stack.

    Every run that measures or qualifies leaves a receipt (JSON, sha256-sealed) that
    anyone can check. Without a GPU, commands run their CPU tier: oracles, contracts and
    the Triton kernels under the Triton interpreter on small shapes.
    """
    ctx.ensure_object(dict)["debug"] = debug


# Sub-commands: one module per command under kdabench/cli/; register each one here. Each
# gets the exit-code table as its --help epilog unless it declares its own (compare).
cli.add_command(kernels_cmd.kernels)
cli.add_command(verify_cmd.verify)
cli.add_command(merge_cmd.merge)
cli.add_command(reseal_cmd.reseal)
cli.add_command(qualify_cmd.qualify)
cli.add_command(serve_sweep_cmd.serve_sweep)
cli.add_command(serve_local_cmd.serve_local)
cli.add_command(report_cmd.report)
cli.add_command(compare_cmd.compare)
cli.add_command(build_kernels_cmd.build_kernels)
cli.add_command(bench_cmd.bench)
cli.add_command(tune_cmd.tune)
cli.add_command(fuzz_cmd.fuzz)


def _show_exit_codes(group: click.Group) -> None:
    """Give every command under `group` the exit-code table as its --help epilog."""
    for command in group.commands.values():
        command.epilog = command.epilog or EXIT_CODES_HELP
        if isinstance(command, click.Group):
            _show_exit_codes(command)


_show_exit_codes(cli)


def main() -> None:
    """Console-script entry point (`kdabench`)."""
    cli(prog_name="kdabench")


if __name__ == "__main__":
    main()
