"""The kernel contract, importable without Triton, CuTe or a GPU.

Error bits of the device-side metadata validation and their host-side decoding.
"""

from __future__ import annotations

import enum


class MetadataFault(enum.IntFlag):
    """Bits of the int32 error code written by the validation prologue (0 = accepted)."""

    DUPLICATE_WRITE_SLOT = 1 << 0
    MALFORMED_LENGTHS = 1 << 1
    SLOT_OUT_OF_RANGE = 1 << 2
    BAD_CHECKPOINT_OFFSET = 1 << 3


FAULT_SENTENCES: dict[MetadataFault, str] = {
    MetadataFault.DUPLICATE_WRITE_SLOT: (
        "a destination slot is written twice in one call, or a write slot aliases another "
        "sequence's initial-state slot"
    ),
    MetadataFault.MALFORMED_LENGTHS: (
        "cu_seqlens is malformed: it must start at 0, never decrease, end within the bound "
        "token capacity, and the live sequence count must lie in 1..max_seqs"
    ),
    MetadataFault.SLOT_OUT_OF_RANGE: (
        "a state slot index lies outside [0, num_slots) and is not the null index -1"
    ),
    MetadataFault.BAD_CHECKPOINT_OFFSET: (
        "an active checkpoint offset lies outside 1..len-1 of its sequence, or the active "
        "offsets of a sequence are not strictly increasing"
    ),
}


class KdaMetadataError(ValueError):
    """Raised on the host when a call's error code is non-zero."""

    def __init__(self, code: int) -> None:
        self.code = int(code)
        super().__init__(decode_error_code(self.code))


def decode_error_code(code: int) -> str:
    """Turn an error code into one readable sentence (or 'accepted' for 0)."""
    code = int(code)
    if code == 0:
        return "accepted"
    parts = [
        f"{fault.name} (bit {fault.value.bit_length() - 1}): {sentence}"
        for fault, sentence in FAULT_SENTENCES.items()
        if code & fault.value
    ]
    unknown = code & ~sum(int(f) for f in MetadataFault)
    if unknown:
        parts.append(f"unknown bits 0x{unknown:x}")
    return (
        f"metadata rejected (error code {code}); the state pool is unchanged and the output "
        "is NaN: " + "; ".join(parts)
    )
