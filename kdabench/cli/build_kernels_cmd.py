"""`kdabench build-kernels`: compile the cute backend ahead of time, no GPU needed."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kdabench.cli.errors import Finding, UserError


def _archs(value: str) -> list[str]:
    from kdabench.kernels.cute.manifest import SUPPORTED_ARCHS

    archs = [a.strip() for a in value.split(",") if a.strip()]
    unknown = [a for a in archs if a not in SUPPORTED_ARCHS]
    if not archs or unknown:
        raise UserError(f"--arch {value!r}: unknown {', '.join(unknown) or 'empty list'}; "
                        f"choose from {', '.join(SUPPORTED_ARCHS)}")
    return archs


@click.command("build-kernels")
@click.option("--arch", "arch_list", default="sm_90a,sm_121a", show_default=True,
              metavar="LIST", help="Comma-separated targets: sm_90a (Hopper), sm_100a, "
              "sm_120a, sm_121a (GB10).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              default=None, metavar="DIR",
              help="Where to write <arch>/ folders (default: $KDABENCH_CUTE_KERNELS, else "
              "~/.cache/kdabench/cute-kernels, where the backend looks at run time).")
@click.option("--check", "check_only", is_flag=True,
              help="Compile nothing: check the builds already in DIR (manifest, sources, "
              "file hashes, every function exported and loadable).")
@click.option("--jobs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Variants compiled at once, each in its own process of about 430 MB "
              "(default: the CPUs this process may use, at most 8; 1 compiles in this "
              "process).")
@click.option("--json", "as_json", is_flag=True, help="Print the manifests and problems as JSON.")
def build_kernels(arch_list: str, out_dir: Path | None, check_only: bool, jobs: int | None,
                  as_json: bool) -> None:
    """Compile the CuTe DSL kernels of the cute backend for GPU targets, on any machine.

    Needs the DSL (pip install 'kdabench[cute]') and a C compiler, not a GPU. Per arch it
    writes DIR/<arch>/: libkdabench_cute.so (79 functions: validation, input transforms,
    the token recurrence's state pass and the tensor-core chunk algorithm's index,
    preparation and pass, for head dims 64/128, capacities 1/2/4, every gate mode; bf16
    activations, fp32 gates), the DSL runtime it links against, and manifest.json (arch, DSL
    and TVM-FFI versions, sha256 of the kernel sources and of each file). At run time the
    backend loads the build whose arch and sources match, through apache-tvm-ffi; copy DIR
    to the GPU machine and point $KDABENCH_CUTE_KERNELS at it. Every build is checked after
    it is written. Exit 1 when a check finds a problem, 2 for bad input or a missing DSL.
    """
    from kdabench.kernels.cute.build import BuildError, build_arch, check_build
    from kdabench.kernels.cute.runtime import artifact_dir
    from kdabench.kernels.cute.variants import aot_variants

    archs = _archs(arch_list)
    folder = out_dir if out_dir is not None else artifact_dir()
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    if not check_only:
        total = sum(len(aot_variants(arch)) for arch in archs)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=console, transient=as_json) as progress:
            task = progress.add_task("compiling", total=total)
            for arch in archs:
                progress.update(task, description=f"compiling for {arch}")
                try:
                    build_arch(arch, folder, progress=lambda _v: progress.advance(task),
                               jobs=jobs)
                except BuildError as error:
                    raise UserError(str(error)) from error
    results = {arch: check_build(folder, arch) for arch in archs}
    if as_json:
        click.echo(json.dumps({arch: {"manifest": manifest, "problems": problems}
                               for arch, (manifest, problems) in results.items()}, indent=2))
    else:
        for arch, (manifest, problems) in results.items():
            where = folder / arch
            if problems:
                console.print(f"[red]{arch}[/red] {where}: " + "; ".join(problems), markup=True)
            else:
                console.print(f"[green]{arch}[/green] {where}: {len(manifest['functions'])} "
                              f"functions, nvidia-cutlass-dsl {manifest['dsl_version']}, "
                              f"sources match")
    bad = [arch for arch, (_, problems) in results.items() if problems]
    if bad:
        raise Finding(f"build check failed for {', '.join(bad)}")
