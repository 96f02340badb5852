"""`kdabench serve-sweep`: cold-TTFT and decode sweeps of an OpenAI-compatible server
across flag arms (DESIGN section 6).

Modules, one job each:

- :mod:`kdabench.sweep.arms`: the arms file (TOML): load and validate.
- :mod:`kdabench.sweep.client`: one server over HTTP: streaming completions with TTFT,
  usage, ``/tokenize``, ``/metrics``.
- :mod:`kdabench.sweep.prompts`: unique prompts of exact token counts.
- :mod:`kdabench.sweep.servers`: launch, attach or embed the server of each arm.
- :mod:`kdabench.sweep.stats`: medians and seeded bootstrap confidence intervals.
- :mod:`kdabench.sweep.runner`: the sweep itself and its receipt.
"""

from kdabench.sweep.arms import Arm, ArmsError, ArmsFile, load_arms
from kdabench.sweep.runner import Sweep, SweepOptions, SweepResult

__all__ = ["Arm", "ArmsError", "ArmsFile", "Sweep", "SweepOptions", "SweepResult", "load_arms"]
