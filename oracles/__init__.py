"""Independent references for the KDA kernels: float64 recurrence, prefix states, chunk mirror."""

from .chunk_mirror import MirrorResult, chunk_kda_mirror
from .gates import GATE_MODES, l2_normalize, log_decay, prepare_inputs
from .metadata import expected_error_code
from .metrics import assert_close, relative_error
from .prefix import PrefixBatch, expected_prefix_states, prefix_batch
from .recurrent import RecurrentResult, recurrent_kda

__all__ = [
    "GATE_MODES",
    "MirrorResult",
    "PrefixBatch",
    "RecurrentResult",
    "assert_close",
    "chunk_kda_mirror",
    "expected_error_code",
    "expected_prefix_states",
    "l2_normalize",
    "log_decay",
    "prefix_batch",
    "prepare_inputs",
    "recurrent_kda",
    "relative_error",
]
