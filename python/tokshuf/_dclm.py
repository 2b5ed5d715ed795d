"""What a user of DCLM's tokshuf-rs needs beyond its flag names (docs/tokshuf-rs.md): its output
conventions (``--dclm-compat``) and its dataset records (``--input-json`` / ``--output-json``)."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Dict, Optional

from ._remote import is_url
from .exceptions import ConfigError

# tokshuf-rs's default tokenizer, the one DCLM's recipes use.
DCLM_TOKENIZER = "EleutherAI/gpt-neox-20b"


@dataclass(frozen=True)
class Conventions:
    """How tokshuf-rs lays out a cache: open_lm's json.gz members, its default seed, each
    file's last context padded, EOT id 0 and padding id vocabulary size + 2 (its constants;
    for GPT-NeoX-20B id 0 is the tokenizer's own <|endoftext|>)."""

    format: str = "json.gz"
    seed: int = 1234
    tail: str = "pad"
    eot_id: Optional[int] = None
    pad_id: Optional[int] = None
    bos_id: Optional[int] = None


# The two tokenizers tokshuf-rs knows, by the names it takes (vocabulary sizes are its own
# constants, not the tokenizers' counts).
_KNOWN = {
    "EleutherAI/gpt-neox-20b": Conventions(eot_id=0, pad_id=50254 + 2),
    "meta-llama/Meta-Llama-3-8B": Conventions(eot_id=0, pad_id=128256 + 2),
}
# tokshuf-rs's tiktoken path for Llama 3 starts every document with <|begin_of_text|>.
_LLAMA3_BOS = 128000


def conventions(tokenizer: str, use_tiktoken: bool) -> Conventions:
    """tokshuf-rs's conventions for `tokenizer` (its name, with or without ``hf:``); for a
    tokenizer it does not know, its format, seed and tail with tokshuf's special ids."""
    name = tokenizer[3:] if tokenizer.startswith("hf:") else tokenizer
    known = _KNOWN.get(name, Conventions())
    if name == "meta-llama/Meta-Llama-3-8B" and use_tiktoken:
        known = Conventions(eot_id=known.eot_id, pad_id=known.pad_id, bos_id=_LLAMA3_BOS)
    return known


def read_record(path: str) -> Dict[str, Any]:
    """A DCLM dataset record (local or object store, decompressed by its name)."""
    from . import _core

    data = _core._storage_read(os.fspath(path), decompress=True)
    try:
        record = json.loads(data)
    except ValueError as e:
        raise ConfigError(f"{path}: not a JSON dataset record ({e})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{path}: not a JSON dataset record (a JSON {type(record).__name__})")
    return record


def _output_size(output: str) -> int:
    """Bytes of every file of the cache, as tokshuf-rs's `size`."""
    from . import _core

    if is_url(output):
        return sum(size for _, size in _core._storage_list(output.rstrip("/") + "/"))
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(output) for f in files)


def update_record(record: Dict[str, Any], output: str, tokenizer: str, metadata: Dict[str, Any]) -> Dict[str, Any]:
    """The record of the tokenized dataset, rewritten as tokshuf-rs rewrites it: where it is,
    that it is tokenized, and (where the record lacks them) its tokenizer, token count
    (contexts x seqlen, padding included, as tokshuf-rs counts) and size in bytes."""
    out = dict(record)
    base = output.rstrip("/")
    out["dataset_url"] = base + "/"
    out["manifest_url"] = base + "/manifest.jsonl"
    out["tokenized"] = True
    if out.get("tokenizer") is None:
        warn(f"the record names no tokenizer: recording {tokenizer!r}")
        out["tokenizer"] = tokenizer
    counted = metadata["num_contexts"] * metadata["seqlen"]
    if out.get("num_tokens") is None:
        out["num_tokens"] = counted
    elif out["num_tokens"] != counted:
        warn(f"the record's num_tokens ({out['num_tokens']}) differs from the cache's ({counted}); kept")
    if out.get("size") is None:
        out["size"] = _output_size(output)
    return out


def write_record(path: str, record: Dict[str, Any]) -> None:
    """Pretty JSON with sorted keys, as tokshuf-rs writes it, compressed by the name's
    extension; to a local path or an object-store URL."""
    from . import _core

    data = json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError:
            raise ConfigError(f"{path}: writing .zst needs the zstandard package (or give a .json name)") from None
        data = zstandard.ZstdCompressor().compress(data)
    if not is_url(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        tmp.write(data)
        tmp.flush()
        _core._storage_put(tmp.name, path)


def warn(message: str) -> None:
    print(f"tokshuf: warning: {message}", file=sys.stderr)
