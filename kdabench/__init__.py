"""kdabench: KDA checkpoint-export prefill kernels, their oracles, and the harness that
qualifies them on a GPU and measures what they buy a serving stack.

Kernels live in :mod:`kdabench.kernels`, oracles in :mod:`kdabench.oracles`; the command
line is ``kdabench`` (:mod:`kdabench.cli.main`).
"""

__version__ = "0.1.0"
