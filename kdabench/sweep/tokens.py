"""Where the token counts of a sweep's prompts come from, best source first.

1. :class:`LocalTokenizer`: a tokenizer the user names (``--tokenizer PATH_OR_NAME``): a
   ``tokenizer.json`` read with ``tokenizers``, else ``transformers``' AutoTokenizer from
   local files. Both are the optional extra ``kdabench[serve]``, imported only here.
2. :class:`ServerTokenize`: the server's ``POST /tokenize``, where it serves one (vLLM,
   the embedded server).
3. :class:`UsageCalibration`: the server's own ``usage.prompt_tokens``. Each count is a
   probe completion (``max_tokens`` 1) of a copy of the text whose leading nonce
   (:class:`~kdabench.sweep.prompts.PromptFactory`'s digits) is swapped for other digits,
   so the probe counts like the text yet shares no cache block with it: the measured
   prompt is still cold when it is sent. Counts are cached per text; the prompt fit's
   call bound bounds the probes per prompt.

Every counter is a callable ``text -> tokens`` with ``describe()``, what the receipt
records per arm as ``token_counts``. :func:`choose_counter` picks the source.
"""

from __future__ import annotations

import functools
import os
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from kdabench.receipts.write import portable_command_line
from kdabench.sweep.client import ServerClient, ServerError, ServerGone
from kdabench.sweep.options import SweepError
from kdabench.sweep.prompts import NONCE_DIGITS

INSTALL_HINT = "pip install 'kdabench[serve]'"
CACHED_COUNTS = 256  # texts whose probed count is kept
_NONCE = re.compile(f"[0-9]{{1,{NONCE_DIGITS}}}")  # PromptFactory's prompts start with one


class TokenCounter(Protocol):
    """Counts the tokens of a text and says where its counts come from."""

    def __call__(self, text: str) -> int: ...

    def describe(self) -> dict[str, Any]: ...


class LocalTokenizer:
    """A tokenizer the user named; ``encode`` gives a text's token ids, special ones
    included (as a server counts them)."""

    def __init__(self, encode: Callable[[str], list[int]], label: str) -> None:
        self._encode = encode
        self.label = label

    def __call__(self, text: str) -> int:
        return len(self._encode(text))

    def describe(self) -> dict[str, Any]:
        return {"source": f"tokenizer {self.label}"}


class ServerTokenize:
    """The server's POST /tokenize."""

    def __init__(self, client: ServerClient) -> None:
        self._client = client

    def __call__(self, text: str) -> int:
        return self._client.tokenize(text)

    def describe(self) -> dict[str, Any]:
        return {"source": "server /tokenize"}


class UsageCalibration:
    """Counts from the server's usage.prompt_tokens of disguised probes (module docstring)."""

    def __init__(self, client: ServerClient, *, seed: int = 0) -> None:
        self._client = client
        self._rng = random.Random(seed)
        self.probes = 0
        self._count = functools.lru_cache(maxsize=CACHED_COUNTS)(self._probe)

    def __call__(self, text: str) -> int:
        return self._count(text)

    def _probe(self, text: str) -> int:
        self.probes += 1
        completion = self._client.complete(disguise(text, self._rng), max_tokens=1,
                                           logprobs=False)
        if completion.prompt_tokens is None:
            raise ServerError("the server serves no /tokenize and reports no "
                              "usage.prompt_tokens, so prompts cannot be sized; give "
                              "--tokenizer PATH_OR_NAME")
        return completion.prompt_tokens

    def describe(self) -> dict[str, Any]:
        return {"source": "server usage (calibrated)", "probes": self.probes,
                "probe_max_tokens": 1}


def disguise(text: str, rng: random.Random) -> str:
    """``text`` with its leading nonce swapped for other digits (the first one differs)."""
    nonce = _NONCE.match(text)
    if nonce is None:
        return text
    first = rng.choice([d for d in "0123456789" if d != text[0]])
    rest = "".join(rng.choice("0123456789") for _ in range(nonce.end() - 1))
    return first + rest + text[nonce.end():]


def serves_tokenize(client: ServerClient) -> bool:
    """Whether POST /tokenize answers with a count (a lost server still raises)."""
    try:
        client.tokenize("kdabench")
    except ServerGone:
        raise
    except ServerError:
        return False
    return True


def choose_counter(client: ServerClient, tokenizer: LocalTokenizer | None = None, *,
                   seed: int = 0) -> TokenCounter:
    """The user's tokenizer, else the server's /tokenize, else calibration on its usage."""
    if tokenizer is not None:
        return tokenizer
    if serves_tokenize(client):
        return ServerTokenize(client)
    return UsageCalibration(client, seed=seed)


# -------------------------------------------------------------------- loading a tokenizer


def load_tokenizer(spec: str) -> LocalTokenizer:
    """The tokenizer ``spec`` names: a tokenizer.json (or a folder holding one), else a
    transformers model folder or name found in local files. SweepError when it cannot."""
    path = Path(spec)
    file = path / "tokenizer.json" if path.is_dir() else path
    label = portable_command_line(["kdabench", spec], Path.cwd())[1]
    if file.is_file() and file.suffix == ".json":
        return LocalTokenizer(_tokenizers_encoder(file, spec), label)
    return LocalTokenizer(_transformers_encoder(spec), label)


def _tokenizers_encoder(file: Path, spec: str) -> Callable[[str], list[int]]:
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise SweepError(f"--tokenizer {spec}: reading {file.name} needs the 'tokenizers' "
                         f"package; {INSTALL_HINT}") from error
    try:
        tokenizer = Tokenizer.from_file(os.fspath(file))
    except Exception as error:  # the library raises types of its own
        raise SweepError(f"--tokenizer {spec}: {file} is not a tokenizer file "
                         f"({str(error)[:200]})") from error
    return lambda text: tokenizer.encode(text).ids


def _transformers_encoder(spec: str) -> Callable[[str], list[int]]:
    try:
        from transformers import AutoTokenizer
    except ImportError as error:
        raise SweepError(f"--tokenizer {spec}: no tokenizer.json there, and loading a "
                         f"transformers tokenizer needs the 'transformers' package; "
                         f"{INSTALL_HINT}") from error
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except Exception as error:  # the library raises types of its own
        raise SweepError(f"--tokenizer {spec}: no tokenizer found in local files "
                         f"({' '.join(str(error).split())[:200]})") from error
    return lambda text: tokenizer(text)["input_ids"]
