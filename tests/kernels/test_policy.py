"""The policy catalog: versioned queries and configs, profiles, modes, and what plan() and
kda_prefill resolve. Resolution takes a device-name string, so profiles for a GPU (an H200
here) are tested on the CPU with profiles written to a tmp folder."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

from kdabench import kernels
from kdabench.kernels import Caps, KdaConfigError, KdaPolicyError, KdaQuery, KernelConfig
from kdabench.kernels.catalog import (
    CATALOG,
    config_from_dict,
    config_problems,
    config_schema,
    power_of_two_at_least,
    shared_memory_estimate,
)
from kdabench.kernels.config import CuteConfig
from kdabench.kernels.policy import (
    POLICY_MODE_ENV,
    PolicyMode,
    device_name_of,
    heuristic_config,
    resolve_config,
    resolve_mode,
)
from kdabench.kernels.profiles import (
    PROFILE_DIR_ENV,
    device_slug,
    entry_document,
    find_profile,
    load_profile,
    profile_dir,
    profile_document,
)

H200 = "NVIDIA H200"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TUNED = KernelConfig(block_v=64, num_warps=8, num_stages=1)


def caps(**changes) -> Caps:
    base = Caps(device=DEVICE, num_heads=8, head_dim=128, max_tokens=8192, max_seqs=1,
                max_state_slots=6, max_checkpoints=4)
    return dataclasses.replace(base, **changes)


def write_profile(folder: Path, device_name: str = H200, rows=None, **changes) -> Path:
    """A profile of `device_name` with the entries `rows` (default: caps() -> TUNED), then
    top-level keys replaced by `changes`."""
    if rows is None:
        rows = [entry_document(KdaQuery.from_caps(caps()), TUNED, {"median_ms": 1.0})]
    document = profile_document(device_name, rows)
    for key, value in changes.items():
        document[key] = value
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{device_slug(device_name)}.json"
    path.write_text(json.dumps(document))
    return path


@pytest.fixture(autouse=True)
def no_policy_env(monkeypatch):
    monkeypatch.delenv(POLICY_MODE_ENV, raising=False)
    monkeypatch.delenv(PROFILE_DIR_ENV, raising=False)


# --------------------------------------------------------------------------- the catalog


def test_kda_prefill_is_registered_with_both_schemas():
    entry = CATALOG["kda_prefill"]
    assert entry.query_type is KdaQuery and entry.config_type is KernelConfig
    schema = entry.schema()
    assert schema["query"] == {"version": 1, "fields": ["heads", "head_dim", "dtype", "capacity",
                                                        "gate", "token_bucket", "seq_bucket"]}
    assert schema["config"]["version"] == 4


@pytest.mark.parametrize("version, lacking", [(1, ("segments", "solve", "checkpoints")),
                                              (2, ("solve", "checkpoints")), (3, ("checkpoints",))])
def test_an_older_profile_loads_with_the_serial_walk_and_substitution(tmp_path, version,
                                                                      lacking):
    """Config schema v1 had no `segments`, v2 no `solve` and v3 no `checkpoints`: their entries
    ran the serial walk (segments = 1), stage 1's substitution solve and the checkpoint
    kernel."""
    schema = CATALOG["kda_prefill"].schema()
    for name in lacking:
        del schema["config"]["fields"][name]
    schema["config"]["version"] = version
    older = {key: value for key, value in dataclasses.asdict(TUNED).items()
             if key not in lacking}
    rows = [{"query": KdaQuery.from_caps(caps()).to_dict(), "config": older,
             "measurements": {"median_ms": 1.0}}]
    write_profile(tmp_path, rows=rows, schema=schema)
    resolved = resolve_config(caps(), device_name=H200, directory=tmp_path)
    assert resolved.config == dataclasses.replace(TUNED, segments=1, solve="substitution",
                                                  checkpoints="kernel")
    assert resolved.source.startswith("profile nvidia-h200.json")


def test_config_schema_is_read_from_the_dataclass():
    fields = [f.name for f in dataclasses.fields(KernelConfig)]
    schema = config_schema()["fields"]
    assert list(schema) == fields
    assert {name: spec["default"] for name, spec in schema.items()} == \
        dataclasses.asdict(KernelConfig())


@pytest.mark.parametrize("value, bucket", [(1, 1), (2, 2), (3, 4), (100, 128), (8192, 8192),
                                           (8193, 16384)])
def test_buckets_are_the_next_power_of_two(value, bucket):
    assert power_of_two_at_least(value) == bucket


def test_query_from_caps():
    query = KdaQuery.from_caps(caps(max_tokens=100, max_seqs=3, gate="softplus"),
                               torch.float16)
    assert query == KdaQuery(heads=8, head_dim=128, dtype="float16", capacity=4,
                             gate="softplus", token_bucket=128, seq_bucket=4)
    assert query.describe() == ("query v1 heads=8 head_dim=128 dtype=float16 capacity=4 "
                                "gate=softplus tokens<=128 seqs<=4")
    assert KdaQuery.from_dict(query.to_dict()) == query
    assert KdaQuery.from_caps(caps(), "half").dtype == "float16"
    with pytest.raises(KdaPolicyError, match="'int4x' is not a torch dtype"):
        KdaQuery.from_caps(caps(), "int4x")


@pytest.mark.parametrize("changes, fragment", [
    ({"block_v": 48}, "block_v 48 does not divide head_dim 128"),
    ({"block_v": 256}, "block_v 256 does not divide head_dim 128"),
    ({"block_v": 8}, "block_v 8 must be a power of two in [16, 128]"),
    ({"num_warps": 3}, "num_warps 3 must be one of"),
    ({"prepare_warps": 32}, "prepare_warps 32 must be one of"),
    ({"num_stages": 0}, "num_stages 0 must be >= 1"),
    ({"chunk_size": 24}, "chunk_size 24 must be a multiple of 16"),
    ({"dot_precision": "fp8"}, "dot_precision 'fp8' must be one of"),
    ({"pipeline": "both"}, "pipeline 'both' must be one of ('fused', 'split')"),
], ids=["block-v-48", "block-v-256", "block-v-8", "warps-3", "prepare-warps-32", "stages-0",
        "chunk-24", "precision", "pipeline"])
def test_config_problems_name_the_field(changes, fragment):
    problems = config_problems(dataclasses.replace(KernelConfig(), **changes), 128)
    assert len(problems) == 1 and fragment in problems[0]


def test_checkpoints_in_the_pass_need_16_token_chunks():
    for chunk_size in (32, 64):
        in_pass = KernelConfig(chunk_size=chunk_size, checkpoints="pass")
        assert config_problems(in_pass, 128) == [
            f"checkpoints 'pass' runs with 16-token chunks only (got chunk_size {chunk_size})"]
        assert config_problems(dataclasses.replace(in_pass, checkpoints="kernel"), 128) == []
    assert config_problems(KernelConfig(chunk_size=16, checkpoints="pass"), 128) == []


@pytest.mark.skipif(not hasattr(KernelConfig(), "operand_dtype"),
                    reason="KernelConfig has no operand_dtype")
def test_operand_dtype_rule_and_its_shared_memory():
    config = dataclasses.replace(KernelConfig(), operand_dtype="fp8")
    assert config_problems(config, 128) == [
        f"operand_dtype 'fp8' must be one of {tuple(kernels.config.OPERAND_DTYPES)}"]
    narrow = dataclasses.replace(KernelConfig(), operand_dtype="bfloat16")
    assert 2 * shared_memory_estimate(narrow, 128) == shared_memory_estimate(KernelConfig(), 128)


def test_defaults_and_heuristic_pass_the_rule():
    for head_dim in (64, 128):
        assert config_problems(KernelConfig(), head_dim) == []
        assert config_problems(heuristic_config(caps(head_dim=head_dim)), head_dim) == []


def test_shared_memory_estimate_by_hand():
    config = KernelConfig(chunk_size=16, block_v=32, num_stages=2)
    # max(16*128 + 128*32, 128*16 + 16*32, 16*16 + 16*32) = 6144 floats, x 4 B x 2 stages
    assert shared_memory_estimate(config, 128) == 2 * 4 * 6144


def test_config_from_dict_wants_exactly_the_dataclass_fields():
    good = dataclasses.asdict(TUNED)
    assert config_from_dict(good) == TUNED
    with pytest.raises(KdaPolicyError, match=r"missing \['block_v'\]"):
        config_from_dict({k: v for k, v in good.items() if k != "block_v"})
    with pytest.raises(KdaPolicyError, match=r"unknown \['sub_chunk'\]"):
        config_from_dict({**good, "sub_chunk": 16})
    with pytest.raises(KdaPolicyError, match="num_warps must be int"):
        config_from_dict({**good, "num_warps": "8"})


# --------------------------------------------------------------------------- modes


def test_mode_per_call_wins_over_the_environment(monkeypatch):
    assert resolve_mode() is PolicyMode.AUTO
    monkeypatch.setenv(POLICY_MODE_ENV, "heuristic_only")
    assert resolve_mode() is PolicyMode.HEURISTIC_ONLY
    assert resolve_mode("preplanned-only") is PolicyMode.PREPLANNED_ONLY
    assert resolve_mode(PolicyMode.AUTO) is PolicyMode.AUTO


def test_bad_modes_are_a_clear_error(monkeypatch):
    with pytest.raises(KdaPolicyError, match=r"policy_mode 'fastest' is not a policy mode "
                       r"\(one of AUTO, HEURISTIC_ONLY, PREPLANNED_ONLY\)"):
        resolve_mode("fastest")
    monkeypatch.setenv(POLICY_MODE_ENV, "sometimes")
    with pytest.raises(KdaPolicyError, match=r"\$KDABENCH_POLICY_MODE 'sometimes' is not"):
        resolve_mode()


# --------------------------------------------------------------------------- resolution


def test_h200_query_resolves_to_the_profile_entry(tmp_path):
    write_profile(tmp_path)
    for mode in ("AUTO", "PREPLANNED_ONLY"):
        resolved = resolve_config(caps(), mode=mode, device_name=H200, directory=tmp_path)
        assert resolved.config == TUNED and resolved.profile == "nvidia-h200.json"
        assert resolved.source == ("profile nvidia-h200.json (query v1 heads=8 head_dim=128 "
                                   "dtype=bfloat16 capacity=4 gate=precomputed tokens<=8192 "
                                   "seqs<=1)")
    # the same bucket (5000 tokens -> 8192) answers; the profile folder from the environment
    resolved = resolve_config(caps(max_tokens=5000), device_name=H200, directory=tmp_path)
    assert resolved.config == TUNED


def test_profile_folder_from_the_environment(tmp_path, monkeypatch):
    write_profile(tmp_path)
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    assert profile_dir() == tmp_path
    assert resolve_config(caps(), device_name=H200).config == TUNED


def test_auto_falls_back_to_the_heuristic_and_says_so(tmp_path):
    write_profile(tmp_path)
    other = caps(max_tokens=9000)  # bucket 16384: not in the profile
    resolved = resolve_config(other, mode="AUTO", device_name=H200, directory=tmp_path)
    assert resolved.config == heuristic_config(other)
    assert resolved.source == ("heuristic (no profile entry for query v1 heads=8 head_dim=128 "
                               "dtype=bfloat16 capacity=4 gate=precomputed tokens<=16384 "
                               "seqs<=1 in nvidia-h200.json)")
    missing = resolve_config(caps(), device_name="NVIDIA H100 80GB HBM3", directory=tmp_path)
    assert missing.config == heuristic_config(caps())
    assert missing.source.startswith("heuristic (no profile entry for query v1 heads=8 ")
    # the folder by a name that holds no machine's path (the source goes into receipts)
    assert f"nvidia-h100-80gb-hbm3.json not in {tmp_path.name})" in missing.source
    assert str(tmp_path) not in missing.source


def test_preplanned_only_refuses_an_unprofiled_query_and_names_it(tmp_path):
    write_profile(tmp_path)
    with pytest.raises(KdaPolicyError) as caught:
        resolve_config(caps(max_checkpoints=1), mode="PREPLANNED_ONLY", device_name=H200,
                       directory=tmp_path)
    message = str(caught.value)
    assert message.startswith("policy mode PREPLANNED_ONLY: no profile entry for query v1 "
                              "heads=8 head_dim=128 dtype=bfloat16 capacity=1 ")
    assert "in nvidia-h200.json" in message and "kdabench tune" in message
    with pytest.raises(KdaPolicyError, match="no profile entry for query v1 heads=8 .* no "
                       "profile for device 'NVIDIA H100'"):
        resolve_config(caps(), mode="PREPLANNED_ONLY", device_name="NVIDIA H100",
                       directory=tmp_path)


def test_the_activation_dtype_is_part_of_the_query(tmp_path):
    write_profile(tmp_path)
    resolved = resolve_config(caps(), activation_dtype=torch.float16, device_name=H200,
                              directory=tmp_path)
    assert resolved.config == heuristic_config(caps()) and "dtype=float16" in resolved.source


def test_heuristic_only_reads_no_profile(tmp_path):
    write_profile(tmp_path, schema={"query": {"version": 99}})  # would be refused if read
    resolved = resolve_config(caps(), mode="HEURISTIC_ONLY", device_name=H200,
                              directory=tmp_path)
    assert resolved.config == heuristic_config(caps())
    assert resolved.source == "heuristic (policy mode HEURISTIC_ONLY)"


# --------------------------------------------------------------------------- bad profiles


def _schema(**changes):
    schema = CATALOG["kda_prefill"].schema()
    for path, value in changes.items():
        part, key = path.split("__")
        schema[part][key] = value
    return schema


@pytest.mark.parametrize("changes, fragment", [
    ({"schema": _schema(query__version=2)}, "query schema v2"),
    ({"schema": _schema(config__version=5)}, "config schema v5"),
    ({"schema": _schema(config__version=1)}, "config schema v1"),  # v1 lacks 3 later fields
    ({"schema": _schema(query__fields=["heads", "head_dim"])},
     "query schema v1 (heads, head_dim) does not match"),
    ({"schema": _schema(config__fields={"block_v": {}, "num_warps": {}})},
     "config schema v4 (block_v, num_warps) does not match"),
    ({"schema": None}, "no 'schema' object"),
], ids=["query-version", "config-version", "config-v1-fields", "query-fields", "config-fields",
        "no-schema"])
@pytest.mark.parametrize("mode", ["AUTO", "PREPLANNED_ONLY"])
def test_a_profile_of_another_schema_is_refused(tmp_path, changes, fragment, mode):
    write_profile(tmp_path, **changes)
    with pytest.raises(KdaPolicyError) as caught:
        resolve_config(caps(), mode=mode, device_name=H200, directory=tmp_path)
    message = str(caught.value)
    assert message.startswith("profile nvidia-h200.json: ") and fragment in message


@pytest.mark.parametrize("changes, fragment", [
    ({"format": "kdabench.profile.v0"}, "format 'kdabench.profile.v0'"),
    ({"operator": "gdn_prefill"}, "operator 'gdn_prefill'"),
    ({"device": {"name": "NVIDIA H100", "slug": "nvidia-h100"}}, "was measured on"),
    ({"entries": [{"query": {"heads": 8}, "config": {}}]}, "entry 1: query fields"),
    ({"entries": [entry_document(KdaQuery.from_caps(caps()),
                                 KernelConfig(block_v=48))]}, "block_v 48 does not divide"),
    ({"entries": [entry_document(KdaQuery.from_caps(caps()), TUNED)] * 2}, "listed twice"),
    ({"entries": {}}, "'entries' must be a list"),
    ({"status": "unfinished"}, "status 'unfinished'"),
], ids=["format", "operator", "device", "query", "invalid-config", "duplicate", "entries",
        "status"])
def test_a_malformed_profile_is_refused(tmp_path, changes, fragment):
    write_profile(tmp_path, **changes)
    with pytest.raises(KdaPolicyError, match="profile nvidia-h200.json") as caught:
        find_profile(H200, tmp_path)
    assert fragment in str(caught.value)


def test_a_profile_that_is_not_json_is_refused(tmp_path):
    (tmp_path / "nvidia-h200.json").write_text("{ not json")
    with pytest.raises(KdaPolicyError, match="profile nvidia-h200.json: not JSON"):
        resolve_config(caps(), device_name=H200, directory=tmp_path)


def test_a_rewritten_profile_is_read_again(tmp_path):
    path = write_profile(tmp_path)
    assert load_profile(path).lookup(KdaQuery.from_caps(caps())).config == TUNED
    other = dataclasses.replace(TUNED, num_warps=2)
    document = json.loads(path.read_text())
    document["entries"][0]["config"]["num_warps"] = 2
    document["tools"] = {"padding": "x" * 10}  # a different size, whatever the clock says
    path.write_text(json.dumps(document))
    assert load_profile(path).lookup(KdaQuery.from_caps(caps())).config == other


def test_device_slugs():
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert device_slug("Intel(R) Xeon(R) CPU") == "intel-xeon-cpu"
    with pytest.raises(KdaPolicyError):
        device_slug("///")


def test_the_packaged_profile_folder_is_the_repositorys():
    folder = profile_dir()
    assert folder.name == "profiles" and (folder / "README.md").is_file()
    for path in folder.glob("*.json"):  # every shipped profile loads under its own name
        assert load_profile(path, expected_slug=path.stem).entries


# --------------------------------------------------------------------------- plan()


def test_plan_reports_config_and_source(tmp_path):
    planned = kernels.plan(caps(max_tokens=64), own_output=False, profile_dir=tmp_path)
    assert planned.config == heuristic_config(caps()) and planned.policy_mode == "AUTO"
    assert planned.config_source.startswith("heuristic (no profile entry for query v1 heads=8 ")
    explicit = kernels.plan(caps(max_tokens=64), TUNED, policy_mode="PREPLANNED_ONLY",
                            own_output=False, profile_dir=tmp_path)
    assert (explicit.config, explicit.config_source) == (TUNED, "explicit")
    assert explicit.policy_mode == "PREPLANNED_ONLY"


def test_plan_takes_the_profile_of_its_device(tmp_path):
    small = caps(max_tokens=64)
    entry = entry_document(KdaQuery.from_caps(small), TUNED)
    write_profile(tmp_path, device_name_of(DEVICE), rows=[entry])
    planned = kernels.plan(small, policy_mode="PREPLANNED_ONLY", own_output=False,
                           profile_dir=tmp_path)
    assert planned.config == TUNED
    assert planned.config_source.startswith(f"profile {device_slug(device_name_of(DEVICE))}.json")


def test_auto_takes_the_backend_the_profile_measured_fastest(tmp_path):
    """An entry naming the cute backend sends "auto" there; an explicit backend keeps its own,
    and Triton keeps the entry's config; an entry without a backend (older profiles) is Triton."""
    query = KdaQuery.from_caps(caps())
    write_profile(tmp_path, rows=[entry_document(query, TUNED, backend="cute")])
    auto = resolve_config(caps(), device_name=H200, directory=tmp_path)
    assert (auto.backend, auto.config) == ("cute", CuteConfig())
    assert auto.source.startswith("profile nvidia-h200.json (query v1 heads=8 ")
    assert "the cute backend measured fastest" in auto.source
    triton = resolve_config(caps(backend="triton"), device_name=H200, directory=tmp_path)
    assert (triton.backend, triton.config) == ("triton", TUNED)
    cute = resolve_config(caps(backend="cute"), device_name=H200, directory=tmp_path)
    assert (cute.backend, cute.config) == ("cute", CuteConfig())
    heuristic = resolve_config(caps(), mode="HEURISTIC_ONLY", device_name=H200,
                               directory=tmp_path)
    assert heuristic.backend == "triton"

    older = entry_document(query, TUNED)
    del older["backend"]
    write_profile(tmp_path, rows=[older])
    assert resolve_config(caps(), device_name=H200, directory=tmp_path).backend == "triton"
    write_profile(tmp_path, rows=[{**older, "backend": "cuda"}])
    with pytest.raises(KdaPolicyError, match="nvidia-h200.json: entry 1: backend 'cuda' is not "
                       "one of triton, cute"):
        resolve_config(caps(), device_name=H200, directory=tmp_path)


def test_auto_takes_the_cute_config_the_profile_measured_fastest(tmp_path):
    """An entry's cute_config (the key split `kdabench tune` measured fastest) is what "auto"
    plans on the cute backend; a bad one refuses the profile, naming the entry."""
    query = KdaQuery.from_caps(caps())
    tuned = CuteConfig(key_split=2)
    write_profile(tmp_path, rows=[entry_document(query, TUNED, backend="cute",
                                                 cute_config=tuned)])
    auto = resolve_config(caps(), device_name=H200, directory=tmp_path)
    assert (auto.backend, auto.config) == ("cute", tuned)
    assert find_profile(H200, tmp_path).lookup(query).cute_config == tuned
    good = entry_document(query, TUNED, backend="cute", cute_config=tuned)
    assert good["cute_config"] == {"threads": 128, "rows_per_thread": 16,
                                   "algorithm": "chunk", "key_split": 2}
    for bad, message in (
            ({"key_split": 3}, "cute_config is not valid: key_split 3 must be one of"),
            ({"key_split": "2"}, "cute_config field key_split must be int, found '2'"),
            ({"backend": "cute"}, "cute_config fields ['backend'] are not CuteConfig's"),
            ([2], "'cute_config' must be an object")):
        write_profile(tmp_path, rows=[{**good, "cute_config": bad}])
        with pytest.raises(KdaPolicyError, match=re.escape(f"nvidia-h200.json: entry 1: {message}")):
            resolve_config(caps(), device_name=H200, directory=tmp_path)


def test_plan_resolves_auto_to_a_backend_that_runs_here(tmp_path):
    """A plan's caps name the backend that runs: auto with an explicit config takes the
    config's backend; auto that the profile sends to a backend this device cannot run (the
    CuTe DSL without a GPU) runs Triton with the entry's config and says why."""
    small = caps(max_tokens=64)
    assert small.backend == "auto"
    explicit = kernels.plan(small, TUNED, own_output=False, profile_dir=tmp_path)
    assert explicit.caps.backend == "triton"
    entry = entry_document(KdaQuery.from_caps(small), TUNED, backend="cute")
    write_profile(tmp_path, device_name_of(DEVICE), rows=[entry])
    planned = kernels.plan(small, own_output=False, profile_dir=tmp_path)
    if DEVICE == "cpu":
        assert (planned.caps.backend, planned.config) == ("triton", TUNED)
        assert planned.config_source.startswith(
            f"profile {device_slug(device_name_of(DEVICE))}.json (query v1 heads=8 ")
        assert "; the profile's cute backend cannot run here: " in planned.config_source
    else:
        assert planned.caps.backend in ("cute", "triton")
        assert planned.caps.backend == "cute" or "cannot run here" in planned.config_source


def test_plan_preplanned_only_refuses_and_names_the_query(tmp_path, monkeypatch):
    monkeypatch.setenv(POLICY_MODE_ENV, "PREPLANNED_ONLY")
    with pytest.raises(KdaPolicyError, match="no profile entry for query v1 heads=8 head_dim=128"):
        kernels.plan(caps(max_tokens=64), own_output=False, profile_dir=tmp_path)
    planned = kernels.plan(caps(max_tokens=64), policy_mode="AUTO", own_output=False,
                           profile_dir=tmp_path)  # the argument wins over the environment
    assert planned.config_source.startswith("heuristic")


def test_plan_refuses_an_invalid_explicit_config():
    with pytest.raises(KdaConfigError, match=r"kernel config \(explicit\) cannot run head_dim "
                       r"128: block_v 48 does not divide head_dim 128"):
        kernels.plan(caps(max_tokens=64), KernelConfig(block_v=48), own_output=False)


def test_kda_prefill_resolves_under_its_policy_mode(tmp_path, monkeypatch):
    from kdabench.inputs import make_inputs
    from kdabench.kernels.triton import launch

    seen = []
    monkeypatch.setattr(launch, "validate", lambda binding: seen.append(binding.plan))
    monkeypatch.setattr(launch, "prefill", lambda binding: None)
    monkeypatch.setenv(PROFILE_DIR_ENV, str(tmp_path))
    x = make_inputs([20, 12], 2, 64, device=DEVICE)
    pool = torch.zeros(4, 2, 64, 64, device=DEVICE)
    index = {"cu_seqlens": x.cu_seqlens,
             "initial_state_indices": torch.tensor([0, 1], dtype=torch.int32, device=DEVICE),
             "final_state_indices": torch.tensor([2, 3], dtype=torch.int32, device=DEVICE)}
    query = KdaQuery(heads=2, head_dim=64, dtype="bfloat16", capacity=1, gate="precomputed",
                     token_bucket=32, seq_bucket=2)
    with pytest.raises(KdaPolicyError, match=query.describe().replace("<", ".")):
        kernels.kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                            policy_mode="PREPLANNED_ONLY", **index)
    write_profile(tmp_path, device_name_of(DEVICE),
                  rows=[entry_document(query, KernelConfig(block_v=64))])
    kernels.kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                        policy_mode="PREPLANNED_ONLY", **index)
    kernels.kda_prefill(x.q, x.k, x.v, x.g, x.beta, state_pool=pool,
                        policy_mode="HEURISTIC_ONLY", **index)
    half = {name: getattr(x, name).to(torch.float16) for name in ("q", "k", "v")}
    with pytest.raises(KdaPolicyError, match="dtype=float16 capacity=1"):
        kernels.kda_prefill(half["q"], half["k"], half["v"], x.g, x.beta, state_pool=pool,
                            policy_mode="PREPLANNED_ONLY", **index)
    assert [p.config.block_v for p in seen] == [64, 16]
    assert seen[0].config_source.startswith("profile ") and seen[0].policy_mode == \
        "PREPLANNED_ONLY"
