"""Device identities for hand-made receipts (the shape kdabench.environment records)."""

H200 = {
    "kind": "cuda", "device": "cuda:0", "name": "NVIDIA H200", "compute_capability": "9.0",
    "sm_count": 132, "total_memory_bytes": 150_000_000_000, "uuid": "GPU-0",
    "driver_version": "580.159.04", "cuda_runtime_version": "13.0",
    "cpu_model": "Intel Xeon", "cpu_count": 16,
}
