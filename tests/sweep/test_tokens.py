"""Prompt token counts without a server's /tokenize: a tokenizer the user names, and
calibration against the usage.prompt_tokens the server reports."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
import sweep_fake_server as fake
from fake_arms import SWEEP, run_sweep

from kdabench.sweep.client import Completion, ServerClient
from kdabench.sweep.options import SweepError
from kdabench.sweep.prompts import MAX_FIT_CALLS, WORDS, PromptFactory
from kdabench.sweep.tokens import (
    LocalTokenizer,
    ServerTokenize,
    UsageCalibration,
    choose_counter,
    disguise,
    load_tokenizer,
)

ARMS = SWEEP + """
[[arms]]
name = "only"
"""
NO_TOKENIZE = {"FAKE_TOKENIZE": "0", "FAKE_MAX_MODEL_LEN": "100000", "FAKE_LIMIT_IN": "models"}


@pytest.fixture
def attached():
    servers = []

    def start(**flags: str) -> str:
        server, url, _ = fake.start(flags)
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def word_level_file(folder: Path) -> Path:
    """A WordLevel tokenizer.json trained here on the prompt filler's words."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    corpus = [" ".join(random.Random(n).choices(WORDS, k=40)) for n in range(300)]
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def subword_counter(split_digits: bool):
    """A BPE tokenizer trained here on the filler's words and nonces (subwords, merges
    across characters): the token count a server of that tokenizer would report. With
    ``split_digits`` every digit is a token of its own (as in Qwen's and DeepSeek's)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(True), byte_level])
                               if split_digits else byte_level)
    rng = random.Random(0)
    corpus = [f"{rng.randrange(10 ** 16):016d} " + " ".join(rng.choices(WORDS, k=30))
              for _ in range(400)]
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["[UNK]"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus, trainer)
    return lambda text: len(tokenizer.encode(text).ids)


class UsageServer:
    """A stand-in client: completions report usage.prompt_tokens from ``count``."""

    def __init__(self, count) -> None:
        self.count = count
        self.prompts: list[str] = []

    def complete(self, prompt: str, *, max_tokens: int, logprobs: bool) -> Completion:
        assert max_tokens == 1
        self.prompts.append(prompt)
        return Completion(prompt_tokens=self.count(prompt))


def sweep(tmp_path: Path, *args: str):
    result, receipts = run_sweep(tmp_path, ARMS, *args)
    return result, (json.loads(receipts[0].read_text()) if receipts else None)


def samples(receipt: dict) -> list[dict]:
    return [record for case in receipt["cases"] if case["kind"] == "cold-ttft"
            for record in case["samples"]]


# ---------------------------------------------------------------------------- calibration


def test_a_probe_starts_with_other_digits_and_is_the_text_after_them() -> None:
    rng = random.Random(0)
    text = "0123456789012345 state chunk 42"
    for _ in range(50):
        probe = disguise(text, rng)
        assert probe[0] != text[0] and probe[16:] == text[16:] and probe[:16].isdigit()
    assert disguise("state chunk", rng) == "state chunk"  # no leading nonce: as it is


@pytest.mark.parametrize("split_digits", [True, False], ids=["digits-split", "digits-merged"])
def test_calibrated_prompts_land_on_the_servers_count_without_sending_the_prompt(
        split_digits: bool) -> None:
    count = subword_counter(split_digits)
    server = UsageServer(count)
    calibration = UsageCalibration(server)  # type: ignore[arg-type]
    factory = PromptFactory(calibration, seed=3)
    for size in (256, 1024, 4096, 1024, 8192):
        before = calibration.probes
        prompt = factory.unique(size)
        reported = count(prompt.text)  # what the server's usage reports when it is sent
        assert abs(reported - size) <= 0.01 * size, (size, reported)
        if split_digits:  # another nonce of the same digits counts exactly alike
            assert reported == prompt.tokens
        assert calibration.probes - before <= MAX_FIT_CALLS + 1
        assert all(sent[:16] != prompt.text[:16] for sent in server.prompts)
    assert calibration.describe() == {"source": "server usage (calibrated)",
                                      "probes": calibration.probes, "probe_max_tokens": 1}


def test_calibration_caches_counts_per_text() -> None:
    server = UsageServer(len)
    calibration = UsageCalibration(server)  # type: ignore[arg-type]
    assert calibration("0123 state") == calibration("0123 state") == 10
    assert calibration.probes == 1 and len(server.prompts) == 1


def test_the_source_is_the_tokenizer_else_tokenize_else_usage(attached, tmp_path: Path) -> None:
    local = LocalTokenizer(lambda text: text.split(), "words")
    with ServerClient(attached()) as client:
        assert choose_counter(client, local) is local
        assert isinstance(choose_counter(client), ServerTokenize)
    with ServerClient(attached(FAKE_TOKENIZE="0")) as client:
        assert isinstance(choose_counter(client), UsageCalibration)


def test_without_tokenize_the_sweep_calibrates_on_usage(tmp_path: Path, attached) -> None:
    url = attached(**NO_TOKENIZE)
    result, receipt = sweep(tmp_path, "--endpoint", url)
    assert result.exit_code == 0, result.output
    counts = receipt["config"]["servers"]["only"]["token_counts"]
    assert counts["source"] == "server usage (calibrated)" and counts["probes"] > 0
    records = samples(receipt)
    assert len(records) == 4
    for record in records:  # the probes left the measured prompts cold
        assert record["prompt_tokens"] == record["asked_tokens"] == record["tokenized_tokens"]
        assert record["token_mismatch"] == 0 and record["cached_tokens"] == 0


def test_with_tokenize_the_receipt_names_it(tmp_path: Path, attached) -> None:
    result, receipt = sweep(tmp_path, "--endpoint", attached(), "--prompt-tokens", "64")
    assert result.exit_code == 0, result.output
    assert receipt["config"]["servers"]["only"]["token_counts"] == {"source": "server /tokenize"}


# ---------------------------------------------------------------------------- a named tokenizer


def test_a_tokenizer_file_or_its_folder_counts_tokens(tmp_path: Path) -> None:
    path = word_level_file(tmp_path / "tok")
    for spec, label in ((str(path), "tokenizer.json"), (str(path.parent), "tok")):
        tokenizer = load_tokenizer(spec)
        assert tokenizer("state chunk 0123456789012345") == 3  # the nonce is one [UNK]
        assert tokenizer.describe() == {"source": f"tokenizer {label}"}  # no machine's folders
        assert PromptFactory(tokenizer).unique(50).tokens == 50


def test_the_sweep_counts_with_the_named_tokenizer_and_records_mismatches(
        tmp_path: Path, attached, monkeypatch) -> None:
    path = word_level_file(tmp_path / "tok")
    monkeypatch.chdir(tmp_path)
    result, receipt = sweep(tmp_path, "--endpoint", attached(**NO_TOKENIZE), "--tokenizer",
                            str(path))
    assert result.exit_code == 0, result.output
    assert receipt["config"]["servers"]["only"]["token_counts"] == {
        "source": "tokenizer tok/tokenizer.json"}  # no machine's folders
    for record in samples(receipt):  # words counted here, characters by the server
        assert record["tokenized_tokens"] == record["asked_tokens"]
        assert record["token_mismatch"] == record["prompt_tokens"] - record["asked_tokens"] > 0


def test_a_bad_tokenizer_is_one_line_exit_2(tmp_path: Path, monkeypatch) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    result, receipt = sweep(tmp_path, "--tokenizer", str(bad))
    assert result.exit_code == 2 and receipt is None
    assert len(result.stderr.strip().splitlines()) == 1
    assert "is not a tokenizer file" in result.stderr
    monkeypatch.setitem(sys.modules, "transformers", None)  # not installed
    with pytest.raises(SweepError, match=r"needs the 'transformers' package; pip install "
                       r"'kdabench\[serve\]'"):
        load_tokenizer(str(tmp_path / "no-such-model"))
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(SweepError, match=r"needs the 'tokenizers' package"):
        load_tokenizer(str(bad))


def test_a_name_not_in_the_local_files_is_refused_without_a_download(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    empty = tmp_path / "no-tokenizer-here"
    empty.mkdir()
    for spec in (str(empty), "kdabench-test/no-such-model"):
        with pytest.raises(SweepError, match="no tokenizer found in local files"):
            load_tokenizer(spec)
