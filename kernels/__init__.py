"""KDA chunked-prefill kernels with interior checkpoint export (kdabench.kernels)."""

from .api import (
    Binding,
    KdaConfigError,
    KdaResult,
    Plan,
    bind,
    ineligibility,
    kda_prefill,
    plan,
    run,
)
from .catalog import CATALOG, KdaPolicyError, KdaQuery
from .config import Caps, KernelConfig
from .contract import KdaMetadataError, MetadataFault, decode_error_code
from .policy import POLICY_MODES, PolicyMode, Resolution, resolve_config, resolve_mode
from .profiles import Profile, find_profile, load_profile, profile_dir
from .support import support_report

__all__ = [
    "CATALOG", "POLICY_MODES", "Binding", "Caps", "KdaConfigError", "KdaMetadataError",
    "KdaPolicyError", "KdaQuery", "KdaResult", "KernelConfig", "MetadataFault", "Plan",
    "PolicyMode", "Profile", "Resolution", "bind", "decode_error_code", "find_profile",
    "ineligibility", "kda_prefill", "load_profile", "plan", "profile_dir", "resolve_config",
    "resolve_mode", "run", "support_report",
]
