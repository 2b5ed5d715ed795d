"""Reading a cache back independently (tarfile + numpy) and the chunks a build must hold."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import List, Sequence

import numpy as np

SEQLEN = 64


def read_chunks(out: Path) -> List[np.ndarray]:
    """Every chunk's ids in manifest order, read with the standard library's tarfile."""
    meta = json.loads((out / "tokshuf.json").read_text())
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    chunks = []
    for k, m in enumerate(manifest):
        assert m["shard"] == f"shard_{k:08d}"
        with tarfile.open(out / f"{m['shard']}.tar") as tar:
            members = tar.getmembers()
            assert [t.name for t in members] == [f"{k:08d}_{i:08d}.npy" for i in range(m["num_sequences"])]
            arrays = [np.load(io.BytesIO(tar.extractfile(t).read()), allow_pickle=False) for t in members]
        assert all(a.shape == (meta["seqlen"],) and a.dtype == np.dtype(meta["dtype"]) for a in arrays)
        chunks.append(np.concatenate(arrays).astype(np.int64))
    return chunks


def expected_chunks(docs_per_file: Sequence[Sequence[str]], tok, eot: int, pad: int, seqlen: int = SEQLEN):
    """Chunks of a shuffle=False, tail=stitch build with one chunk per file: each file's whole
    contexts in file order, then one chunk of all files' tails, padded once."""
    chunks, tails = [], []
    for docs in docs_per_file:
        stream: List[int] = []
        for d in docs:
            if d:
                stream += tok.encode(d) + [eot]
        whole = len(stream) // seqlen * seqlen
        if whole:
            chunks.append(np.array(stream[:whole], dtype=np.int64))
        tails += stream[whole:]
    if tails:
        tails += [pad] * (-len(tails) % seqlen)
        chunks.append(np.array(tails, dtype=np.int64))
    return chunks


def assert_cache_holds(out: Path, docs_per_file: Sequence[Sequence[str]], tok) -> None:
    meta = json.loads((out / "tokshuf.json").read_text())
    assert meta["status"] == "complete"
    got = read_chunks(out)
    want = expected_chunks(docs_per_file, tok, meta["eot_id"], meta["pad_id"], meta["seqlen"])
    assert [len(c) for c in got] == [len(c) for c in want]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert meta["num_documents"] == sum(1 for docs in docs_per_file for d in docs if d)
