"""The cute backend: CuTe DSL kernels, their ahead-of-time build, and how they are loaded."""

from __future__ import annotations

import importlib.util
import os
import sys


def expose_dsl_packages() -> None:
    """Make `import cutlass` work where the DSL's libraries are installed without the
    `nvidia-cutlass-dsl` meta-package (the `[cute]` extra: one CUDA runtime, not two): add
    `nvidia_cutlass_dsl/dsl_packages` to sys.path, as that meta-package's .pth file does."""
    if importlib.util.find_spec("cutlass") is not None:
        return
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
    for root in (spec.submodule_search_locations or []) if spec else []:
        packages = os.path.join(root, "dsl_packages")
        if os.path.isdir(packages) and packages not in sys.path:
            sys.path.append(packages)


expose_dsl_packages()
