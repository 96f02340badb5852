"""KDA chunked-prefill kernels with interior checkpoint export (kdabench.kernels)."""

from .api import Binding, KdaConfigError, KdaResult, Plan, bind, ineligibility, kda_prefill, plan, run
from .config import Caps, KernelConfig
from .errors import KdaMetadataError, MetadataFault, decode_error_code
from .support import support_report

__all__ = [
    "Binding", "Caps", "KdaConfigError", "KdaMetadataError", "KdaResult", "KernelConfig",
    "MetadataFault", "Plan", "bind", "decode_error_code", "ineligibility", "kda_prefill",
    "plan", "run", "support_report",
]
