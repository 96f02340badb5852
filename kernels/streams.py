"""One side stream per CUDA device, on which a backend's serial pass over one range of chunks
runs while the caller's stream prepares the next range (kernels/NOTES.md, v11 and cute v7)."""

from __future__ import annotations

import torch

_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of CUDA device `device`, made on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]
