"""Arms files for the sweeps run against sweep_fake_server.py: a quick [sweep] table (small
prompts, few samples, short windows) that each test module appends its arms to."""

SWEEP = """
schema = "kdabench.arms.v1"
name = "fake"
[sweep]
prompt_tokens = [64, 128]
samples = 2
warmups = 1
probe_tokens = 8
decode_window_s = 0.2
decode_prompt_tokens = 32
shared_prefix_tokens = 64
health_timeout_s = 20.0
"""
