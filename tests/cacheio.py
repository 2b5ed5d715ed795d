"""Read a tokshuf cache with nothing but the standard library and NumPy (no tokshuf code),
so tests check the on-disk format itself (DESIGN §2-3)."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Dict, List

import numpy as np


def metadata(cache: Path) -> dict:
    return json.loads((Path(cache) / "tokshuf.json").read_text())


def manifest(cache: Path) -> List[dict]:
    text = (Path(cache) / "manifest.jsonl").read_text()
    assert text == "" or text.endswith("\n"), "manifest.jsonl must end with a newline"
    return [json.loads(line) for line in text.splitlines()]


def decode_member(name: str, data: bytes) -> np.ndarray:
    if name.endswith(".npy"):
        return np.load(io.BytesIO(data), allow_pickle=False)
    assert name.endswith(".json.gz"), name
    return np.array(json.loads(gzip.decompress(data)), dtype=np.int64)


def read_chunk(path: Path) -> List[np.ndarray]:
    out = []
    with tarfile.open(path, "r:") as tar:
        for m in tar:
            f = tar.extractfile(m)
            assert f is not None, f"{path}: {m.name} is not a regular file"
            out.append(decode_member(m.name, f.read()))
    return out


def read_chunks(cache: Path) -> List[List[np.ndarray]]:
    """Contexts of every chunk, in manifest order."""
    return [read_chunk(Path(cache) / f"{m['shard']}.tar") for m in manifest(cache)]


def read_contexts(cache: Path) -> List[List[int]]:
    return [ctx.tolist() for chunk in read_chunks(cache) for ctx in chunk]


def file_bytes(cache: Path) -> Dict[str, bytes]:
    """Every file of a cache; tokshuf.json without its ``build`` key (DESIGN §2)."""
    out = {}
    for p in sorted(Path(cache).rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            if p.name == "tokshuf.json":
                meta = json.loads(data)
                meta.pop("build")
                data = json.dumps(meta, sort_keys=True).encode()
            out[str(p.relative_to(cache))] = data
    return out
