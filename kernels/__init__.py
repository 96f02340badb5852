"""KDA chunked-prefill kernels with interior checkpoint export (kdabench.kernels).

The public names load on first use (PEP 562), so `import kdabench.kernels.contract` stays
free of torch, Triton and CuTe; `from kdabench.kernels import kda_prefill` loads the API.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the submodule that defines it.
_EXPORTS = {
    **dict.fromkeys(("Binding", "KdaConfigError", "KdaResult", "Plan", "bind", "ineligibility",
                     "kda_prefill", "plan", "run"), "api"),
    **dict.fromkeys(("CATALOG", "KdaPolicyError", "KdaQuery"), "catalog"),
    **dict.fromkeys(("Caps", "KernelConfig"), "config"),
    **dict.fromkeys(("KdaMetadataError", "MetadataFault", "decode_error_code"), "contract"),
    **dict.fromkeys(("EXPLICIT_SOURCE", "POLICY_MODES", "PolicyMode", "Resolution",
                     "resolve_config", "resolve_mode"), "policy"),
    **dict.fromkeys(("Profile", "find_profile", "load_profile", "profile_dir"), "profiles"),
    "support_report": "support",
}

_SUBMODULES = ("api", "catalog", "config", "contract", "cute", "policy", "profiles", "support",
               "triton")

__all__ = [
    "CATALOG", "EXPLICIT_SOURCE", "POLICY_MODES", "Binding", "Caps", "KdaConfigError", "KdaMetadataError",
    "KdaPolicyError", "KdaQuery", "KdaResult", "KernelConfig", "MetadataFault", "Plan",
    "PolicyMode", "Profile", "Resolution", "bind", "decode_error_code", "find_profile",
    "ineligibility", "kda_prefill", "load_profile", "plan", "profile_dir", "resolve_config",
    "resolve_mode", "run", "support_report",
]


def __getattr__(name: str) -> Any:
    """Load a public name's submodule (or a submodule itself) on first use; keep it here."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
