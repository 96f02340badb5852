"""Embedded kernel-config profiles, one JSON file per device (`nvidia-h200.json`), written by
`kdabench tune` and read by the policy catalog (kdabench.kernels.profiles). Data only."""
