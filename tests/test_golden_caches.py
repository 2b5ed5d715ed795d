"""Whole caches pinned by golden hashes: every file of the cache (tokshuf.json without its
``build`` key) for both tokenizer families, every member format, stitch and pad, shuffled and
streaming. The hashes were taken before the core was reorganised (issue 11); they change only
with an intended format change."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import tokshuf

DATA = Path(__file__).parent / "data"
NEOX = str(DATA / "gpt-neox-20b.json")

# (tokenizer, format, tail, shuffle) -> sha256 over every file of the cache.
GOLDEN = {
    ("neox", "npy", "stitch", True): "b3c213f62de6384027e724cdba8154eec71259cedc43f8cee4a1d8cc85c8f191",
    ("neox", "json.gz", "pad", False): "d0c7145b88f39a24251cf68b40497dcd04c2611ab36b7f72682957ceabc4e669",
    ("neox", "npy", "pad", True): "b2c278ae6c613506e0c27bf4f307320bfe64e880f286d01d619c79b393b4eba0",
    ("cl100k", "npy", "pad", False): "a128ca1697d20f7360048be543cfebbeb7a6657b77d6ea603eb4b764fe834c9d",
    ("cl100k", "json.gz", "stitch", True): "849ab8e650f95ac5d4dc0f64b7140bdd3ee6cad2b5112ea952fb020c27067697",
    ("cl100k", "npy", "stitch", False): "64e3b7765d35c6acee6897789c684cd642ead30d7e47710284877b197ae9a28e",
    # The block formats (issue 16), blocks of 3 contexts: chunks of 7 end in a short block.
    ("neox", "blocks", "stitch", True): "c98495e2b90f0133eb630d5f99c9c9b9d668cfc7c5d1601bec44a97c6013b4e1",
    ("cl100k", "blocks.zst", "pad", False): "b5822c3b6a71d0c3350ddf0df5d67bbe2b1de979f975e9cfb90c1cbe53d4bf29",
    ("neox", "blocks.zst", "stitch", True): "f75d305681b3574b01e412b7eaf9c4b2f645d1df9f44c435422190aa71bd0c08",
}


def _corpus(root: Path) -> list:
    """Three real-text inputs (plain, gzip, zstd), written deterministically."""
    import gzip

    import zstandard

    lines = (DATA / "sample" / "kjv.jsonl").read_bytes().splitlines(keepends=True)
    parts = [b"".join(lines[0:30]), b"".join(lines[30:55]), b"".join(lines[55:80])]
    (root / "in").mkdir()
    (root / "in" / "a.jsonl").write_bytes(parts[0])
    (root / "in" / "b.jsonl.gz").write_bytes(gzip.compress(parts[1], mtime=0))
    (root / "in" / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(parts[2]))
    return ["in/a.jsonl", "in/b.jsonl.gz", "in/c.jsonl.zst"]


def cache_digest(cache: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(cache.iterdir()):
        data = p.read_bytes()
        if p.name == "tokshuf.json":
            meta = json.loads(data)
            meta.pop("build")
            data = json.dumps(meta, sort_keys=True).encode()
        h.update(p.name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


@pytest.mark.parametrize("case", list(GOLDEN), ids=lambda c: "-".join(str(x) for x in c))
def test_golden_cache(tmp_path, monkeypatch, case):
    tok, fmt, tail, shuffle = case
    monkeypatch.chdir(tmp_path)  # relative input paths: tokshuf.json does not depend on tmp_path
    inputs = _corpus(tmp_path)
    shutil.copy(NEOX, tmp_path / "neox.json")  # a relative spec: tokshuf.json records it
    tokshuf.build_cache(
        inputs,
        "cache",
        tokenizer="neox.json" if tok == "neox" else "tiktoken:cl100k_base",
        seqlen=257,
        chunk_size=7,
        num_local_cells=3,
        seed=11,
        format=fmt,
        tail=tail,
        shuffle=shuffle,
        threads=2,
        progress=False,
        **(dict(block_size=3) if fmt.startswith("blocks") else {}),
    )
    digest = cache_digest(tmp_path / "cache")
    assert digest == GOLDEN[case], digest
