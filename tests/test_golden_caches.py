"""Whole caches pinned by golden hashes: every file of the cache (tokshuf.json without its
``build`` key) for both tokenizer families, every member format, stitch and pad, shuffled and
streaming. They change only with an intended format change: the shards and manifests are those
of before the core was reorganised (issue 11); tokshuf.json changed once since, when input paths
became relative to the inputs' common folder (issue 15: "in/a.jsonl" -> "a.jsonl")."""

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
    ("neox", "npy", "stitch", True): "b5ebf9bd80f029d1d37ff3d726b029a10f2681c72ddaf550dc3534a152fa8bb3",
    ("neox", "json.gz", "pad", False): "93da67e04ceb2f717f1bb27c15cb306355c5a71a8122d7b7dab4a51ed7e3839a",
    ("neox", "npy", "pad", True): "2ffeb70ae19b43ab30490dd8247141fcfffaeb690b07a6113e7bcfe6a83e91c2",
    ("cl100k", "npy", "pad", False): "ea6fd4d6807a59f43bdbf2e43e790a2432142538c00e05e768eda0d68bf25de9",
    ("cl100k", "json.gz", "stitch", True): "aeb8e05ca89342e7f38035137d57b2dd3e9bcff6d3a0f28d78919b2e2a89b745",
    ("cl100k", "npy", "stitch", False): "86745c4ece9a014983552b7e1adbc52f4b39bca1da684d7cda0ebefcedf5daa4",
    # The block formats (issue 16), blocks of 3 contexts: chunks of 7 end in a short block.
    ("neox", "blocks", "stitch", True): "7982b603313976e6febb7349f5d691275f6f1a191f023e83845a3f857f005095",
    ("cl100k", "blocks.zst", "pad", False): "d6d45a23ffc96d275af6cfcc75fc9a3dec979a36cb2ba3adb6503a4467a275e1",
    ("neox", "blocks.zst", "stitch", True): "9141405f1ab5cdde7c8011d5ab04944fd539519aa64bba5d368305747dbe5b7b",
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
    monkeypatch.chdir(tmp_path)  # a relative tokenizer spec: tokshuf.json does not depend on tmp_path
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
