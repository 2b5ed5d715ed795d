"""Reference tokenizers (Python ``tiktoken`` and ``tokenizers``) built from pinned local files.

Never downloads: the tiktoken ranks are the ones embedded in the Rust crate
(``rust/tokshuf-core/data/*.tiktoken.gz``), checked against ``tests/data/SHA256SUMS`` and
against the hash tiktoken itself expects; ``pat_str`` and special tokens come from the
installed ``tiktoken_ext.openai_public``. Used by the tests and by ``benches/``.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
from pathlib import Path
from typing import Dict

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
EMBEDDED = ROOT / "rust" / "tokshuf-core" / "data"
NEOX_JSON = DATA / "gpt-neox-20b.json"
SAMPLE = DATA / "sample"
TIKTOKEN_NAMES = ("r50k_base", "p50k_base", "cl100k_base", "o200k_base")


def pinned_sums() -> Dict[str, str]:
    sums = {}
    for line in (DATA / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split()
            sums[name] = digest
    return sums


def _parse_ranks(data: bytes) -> Dict[bytes, int]:
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def tiktoken_reference(name: str):
    """A ``tiktoken.Encoding`` equal to ``tiktoken.get_encoding(name)``, built offline."""
    import tiktoken
    import tiktoken_ext.openai_public as public

    raw = gzip.decompress((EMBEDDED / f"{name}.tiktoken.gz").read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    pinned = pinned_sums().get(f"{name}.tiktoken")
    if pinned is not None and digest != pinned:
        raise AssertionError(f"embedded {name} ranks differ from tests/data/SHA256SUMS")
    ranks = _parse_ranks(raw)
    expected = {}

    def offline_load(url, expected_hash=None):  # stands in for the downloading loader
        expected["hash"] = expected_hash
        return ranks

    original = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = offline_load
    try:
        params = public.ENCODING_CONSTRUCTORS[name]()
    finally:
        public.load_tiktoken_bpe = original
    if expected.get("hash") not in (None, digest):
        raise AssertionError(f"embedded {name} ranks differ from the hash tiktoken expects")
    return tiktoken.Encoding(**params)


@functools.cache
def neox_reference():
    """GPT-NeoX-20B as DESIGN §4 defines it: special-token strings in text are ordinary text."""
    import tokenizers

    digest = hashlib.sha256(NEOX_JSON.read_bytes()).hexdigest()
    if digest != pinned_sums()["gpt-neox-20b.json"]:
        raise AssertionError("tests/data/gpt-neox-20b.json differs from tests/data/SHA256SUMS")
    tok = tokenizers.Tokenizer.from_file(str(NEOX_JSON))
    tok.encode_special_tokens = True
    return tok


def reference_encode_batch(spec: str, texts):
    """Reference ids for a tokshuf tokenizer spec (``tiktoken:NAME`` or the NeoX json path)."""
    if spec.startswith("tiktoken:"):
        return tiktoken_reference(spec.split(":", 1)[1]).encode_ordinary_batch(list(texts))
    return [e.ids for e in neox_reference().encode_batch(list(texts), add_special_tokens=False)]


@functools.cache
def sample_texts() -> tuple:
    """The documents of the committed sample corpus (tests/data/sample), in file order."""
    texts = []
    for path in sorted(SAMPLE.glob("*.jsonl")):
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f)
    return tuple(texts)
