"""Read a tokshuf cache with nothing but the standard library and NumPy (no tokshuf code),
so tests check the on-disk format itself (DESIGN §2-3), and the chunks a streaming build of
known documents must hold."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any, Dict, List, Sequence

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


def chunk_ids(out: Path) -> List[np.ndarray]:
    """Every chunk's ids in manifest order, concatenated, checking member names, shapes and dtype."""
    meta = metadata(out)
    chunks = []
    for k, m in enumerate(manifest(out)):
        assert m["shard"] == f"shard_{k:08d}"
        with tarfile.open(Path(out) / f"{m['shard']}.tar") as tar:
            members = tar.getmembers()
            assert [t.name for t in members] == [f"{k:08d}_{i:08d}.npy" for i in range(m["num_sequences"])]
        arrays = read_chunk(Path(out) / f"{m['shard']}.tar")
        assert all(a.shape == (meta["seqlen"],) and a.dtype == np.dtype(meta["dtype"]) for a in arrays)
        chunks.append(np.concatenate(arrays).astype(np.int64))
    return chunks


def expected_chunks(docs_per_file: Sequence[Sequence[str]], tok, eot: int, pad: int, seqlen: int):
    """Chunks of a shuffle=False, tail=stitch build with one chunk per file: each file's whole
    contexts in file order, then one chunk of all files' tails, padded once."""
    chunks, tails = [], []
    for docs in docs_per_file:
        stream: List[int] = []
        for d in docs:
            if d:
                stream += [*tok.encode(d), eot]
        whole = len(stream) // seqlen * seqlen
        if whole:
            chunks.append(np.array(stream[:whole], dtype=np.int64))
        tails += stream[whole:]
    if tails:
        tails += [pad] * (-len(tails) % seqlen)
        chunks.append(np.array(tails, dtype=np.int64))
    return chunks


def assert_cache_holds(out: Path, docs_per_file: Sequence[Sequence[str]], tok) -> None:
    meta = metadata(out)
    assert meta["status"] == "complete"
    got = chunk_ids(out)
    want = expected_chunks(docs_per_file, tok, meta["eot_id"], meta["pad_id"], meta["seqlen"])
    assert [len(c) for c in got] == [len(c) for c in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert meta["num_documents"] == sum(1 for docs in docs_per_file for d in docs if d)


def assert_same_cache(got: Path, want: Path) -> None:
    """Byte-identical caches (tokshuf.json but `build`), with no temporary or work files left."""
    a, b = file_bytes(got), file_bytes(want)
    assert sorted(a) == sorted(b), "file sets differ (leftover temporary or missing files)"
    for name in a:
        assert a[name] == b[name], f"{name} differs"
    assert not list(Path(got).rglob("*.tmp*")) and not (Path(got) / ".tokshuf-work").exists()


def same_except_input_names(a: Path, b: Path) -> None:
    """Two local caches: identical shards and manifest; tokshuf.json equal but for the input
    names (and the run's own ``build`` figures)."""
    names = sorted(p.name for p in a.iterdir() if p.is_file())
    assert names == sorted(p.name for p in b.iterdir() if p.is_file())
    for n in names:
        if n != "tokshuf.json":
            assert (a / n).read_bytes() == (b / n).read_bytes(), n
    ma, mb = (json.loads((d / "tokshuf.json").read_text()) for d in (a, b))
    assert strip_names(ma) == strip_names(mb)


def strip_names(meta: Any) -> Any:
    """tokshuf.json without ``build`` and with input paths cut to their file names."""
    if isinstance(meta, dict):
        return {k: strip_names(v) for k, v in meta.items() if k != "build"}
    if isinstance(meta, list):
        return [strip_names(v) for v in meta]
    if isinstance(meta, str) and ("/" in meta) and meta.endswith((".jsonl", ".gz", ".zst")):
        return meta.rsplit("/", 1)[1]
    return meta
