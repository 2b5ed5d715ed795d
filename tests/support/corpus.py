"""Small deterministic corpora written as jsonl, jsonl.gz or jsonl.zst."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Iterable, List

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
]


def write_jsonl(path: Path, docs: Iterable[str], key: str = "text") -> Path:
    """Write documents as jsonl (gzip or zstd by suffix)."""
    payload = "".join(json.dumps({key: d}) + "\n" for d in docs).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    elif path.name.endswith((".zst", ".zstd")):
        import zstandard

        payload = zstandard.ZstdCompressor().compress(payload)
    path.write_bytes(payload)
    return path


def make_docs(n: int, seed: int = 0) -> List[str]:
    """Deterministic documents of varied length (some shorter, some longer than a context)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 400))) + "." for _ in range(n)]


def three_files(root: Path) -> List[Path]:
    """Three small input files (plain, gzip, zstd) with known documents."""
    return [
        write_jsonl(root / "a.jsonl", make_docs(40, 1)),
        write_jsonl(root / "b.jsonl.gz", make_docs(25, 2)),
        write_jsonl(root / "c.jsonl.zst", make_docs(30, 3)),
    ]


def parts(root: Path, n: int, docs: int, step: int, seed: int, name: str = "part") -> List[Path]:
    """`n` plain files `{name}{i}.jsonl` of `docs + step * i` documents (seeds `seed + i`)."""
    return [write_jsonl(root / f"{name}{i}.jsonl", make_docs(docs + step * i, seed + i)) for i in range(n)]


def multi_member_inputs(root: Path) -> List[Path]:
    """The three small files plus a multi-member gzip and a multi-frame zstd file."""
    import zstandard

    files = three_files(root)
    docs = [make_docs(30, s) for s in (11, 12, 13)]
    lines = [("".join(json.dumps({"text": d}) + "\n" for d in part)).encode() for part in docs]
    gz = root / "d.jsonl.gz"
    gz.write_bytes(b"".join(gzip.compress(x, mtime=0) for x in lines))
    zst = root / "e.jsonl.zst"
    zst.write_bytes(b"".join(zstandard.ZstdCompressor().compress(x) for x in lines))
    return sorted([*files, gz, zst])
