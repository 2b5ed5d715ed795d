"""shuffle=False builds stream: chunks are formed per input file, ordered round robin over the
files (exhausted files drop out; the stitched tails' chunks come last), and written while stage 1
still runs, with manifest.jsonl a prefix of the final one and tokshuf.json saying "streaming"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List

import pytest
import tokshuf
from support.build import run_to_pause
from support.cache import read_chunks
from support.corpus import make_docs, write_jsonl

OPTS = dict(seqlen=32, chunk_size=16, threads=2, progress=False, shuffle=False)


def read_docs(path: Path) -> List[str]:
    if path.name.endswith(".gz"):
        import gzip

        text = gzip.decompress(path.read_bytes()).decode()
    elif path.name.endswith(".zst"):
        import zstandard

        text = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()).decode()
    else:
        text = path.read_text()
    return [json.loads(line)["text"] for line in text.splitlines() if line.strip()]


def reference_chunks(inputs, meta) -> List[List[List[int]]]:
    """The shuffle=False chunk order of DESIGN §5, from the documents, in plain Python."""
    tok = tokshuf.Tokenizer(meta["tokenizer"]["spec"])
    seqlen, cs, tail = meta["seqlen"], meta["chunk_size"], meta["tail"]
    eot, pad = meta["eot_id"], meta["pad_id"]
    files, tails = [], []
    for path in sorted(inputs, key=str):
        ids = [i for doc in read_docs(path) if doc for i in tok.encode(doc) + [eot]]
        n = len(ids) // seqlen
        ctxs = [ids[k * seqlen : (k + 1) * seqlen] for k in range(n)]
        rest = ids[n * seqlen :]
        if tail == "pad" and rest:
            ctxs.append(rest + [pad] * (seqlen - len(rest)))
        elif tail == "stitch":
            tails += rest
        files.append([ctxs[j : j + cs] for j in range(0, len(ctxs), cs)])
    chunks = [f[j] for j in range(max(map(len, files))) for f in files if j < len(f)]
    if tails:
        n = -(-len(tails) // seqlen)
        tails += [pad] * (n * seqlen - len(tails))
        stitched = [tails[k * seqlen : (k + 1) * seqlen] for k in range(n)]
        chunks += [stitched[j : j + cs] for j in range(0, n, cs)]
    return chunks


@pytest.fixture
def uneven_corpus(tmp_path):
    """Files of very different lengths (one with no whole context, one with empty documents),
    so files run out in different rounds."""
    root = tmp_path / "in"
    return [
        write_jsonl(root / "a.jsonl", make_docs(120, 1)),
        write_jsonl(root / "b.jsonl.gz", make_docs(15, 2)),
        write_jsonl(root / "c.jsonl", ["tiny"]),
        write_jsonl(root / "d.jsonl.zst", make_docs(60, 4) + ["", ""] + make_docs(10, 5)),
        write_jsonl(root / "e.jsonl", make_docs(200, 6)),
    ]


@pytest.mark.parametrize("tail", ["stitch", "pad", "drop"])
def test_round_robin_order_matches_reference(uneven_corpus, tmp_path, tail):
    out = tmp_path / "cache"
    stats = tokshuf.build_cache(uneven_corpus, out, tail=tail, **OPTS)
    got, want = (
        [[c.tolist() for c in chunk] for chunk in read_chunks(out)],
        reference_chunks(uneven_corpus, stats.metadata),
    )
    assert [len(c) for c in got] == [len(c) for c in want] == stats.metadata["chunk_sizes"]
    assert got == want
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [m["num_sequences"] for m in manifest] == stats.metadata["chunk_sizes"]
    assert sum(m["num_tokens"] for m in manifest) == stats.num_tokens


@pytest.mark.slow
def test_more_files_than_are_read_side_by_side(tmp_path):
    # The builder reads at most 64 files at once; the order must not notice.
    inputs = [write_jsonl(tmp_path / "in" / f"f{i:03d}.jsonl", make_docs(2 + i % 7, i)) for i in range(70)]
    out = tmp_path / "cache"
    stats = tokshuf.build_cache(inputs, out, **dict(OPTS, chunk_size=4, tail="pad"))
    assert [[c.tolist() for c in chunk] for chunk in read_chunks(out)] == reference_chunks(inputs, stats.metadata)


def test_thread_count_does_not_change_the_bytes(uneven_corpus, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    tokshuf.build_cache(uneven_corpus, one, **dict(OPTS, threads=1))
    tokshuf.build_cache(uneven_corpus, two, **dict(OPTS, threads=2))
    for p in sorted(one.iterdir()):
        if p.name != "tokshuf.json":
            assert p.read_bytes() == (two / p.name).read_bytes(), p.name


@pytest.mark.slow
def test_chunks_are_published_while_files_are_tokenized(tmp_path):
    inputs = [write_jsonl(tmp_path / "in" / f"p{i}.jsonl", make_docs(300 + 50 * i, 40 + i)) for i in range(4)]
    opts = dict(OPTS, chunk_size=64)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **opts)
    out = tmp_path / "cache"
    # Stop the build just as its last input file is finished, before the plan is known.
    assert run_to_pause(inputs, out, opts, "stage1.file:4", tmp_path / "trace.txt") == "stage1.file:4"
    trace = (tmp_path / "trace.txt").read_text().splitlines()
    assert "stage2.shard" in trace[: trace.index("paused stage1.file")], "no chunk written during stage 1"
    meta = json.loads((out / "tokshuf.json").read_text())
    assert meta["status"] == "streaming" and "num_chunks" not in meta
    listed = (out / "manifest.jsonl").read_text().splitlines()
    final = (want / "manifest.jsonl").read_text().splitlines()
    assert 0 < len(listed) < len(final) and listed == final[: len(listed)]
    for line in listed:  # what the manifest lists is there, whole
        name = json.loads(line)["shard"] + ".tar"
        assert (out / name).read_bytes() == (want / name).read_bytes()
    tokshuf.build_cache(inputs, out, **opts)
    assert (out / "manifest.jsonl").read_text().splitlines() == final
