"""`kdabench serve-sweep`: cold-TTFT and decode sweeps of an OpenAI-compatible server
across flag arms (docs/DESIGN.md §10).

Modules, one job each:

- :mod:`kdabench.sweep.arms`: the arms file (TOML): load and validate.
- :mod:`kdabench.sweep.client`: one server over HTTP: streaming completions with TTFT,
  usage, ``/tokenize``, ``/metrics``.
- :mod:`kdabench.sweep.prompts`: unique prompts of exact token counts.
- :mod:`kdabench.sweep.servers`: launch, attach or embed the server of each arm.
- :mod:`kdabench.sweep.options`: what to measure (:class:`SweepOptions`), validated.
- :mod:`kdabench.sweep.state`: everything measured for one arm, raw (:class:`ArmState`).
- :mod:`kdabench.sweep.phases`: the per-arm steps: server info, activation, warmups, probes,
  cold samples, shared prefix, decode.
- :mod:`kdabench.sweep.limits`: whether the sweep's requests fit a server's max_model_len.
- :mod:`kdabench.sweep.cases`: the receipt's cases and the live table, from the arm states.
- :mod:`kdabench.sweep.runner`: the sweep itself: servers up, phases in order, the receipt.
"""

from kdabench.sweep.arms import Arm, ArmsError, ArmsFile, load_arms
from kdabench.sweep.options import SweepOptions
from kdabench.sweep.runner import Sweep, SweepResult

__all__ = ["Arm", "ArmsError", "ArmsFile", "Sweep", "SweepOptions", "SweepResult", "load_arms"]
