"""The build (DESIGN §2-5): determinism, windowing and tails, the on-disk format as stock
tools read it, and the output folder rules."""

from __future__ import annotations

import functools
import gc
import io
import json
import os
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tokshuf
from hypothesis import given
from hypothesis import strategies as st
from support import cache, tokref
from support.build import build as run_build
from support.corpus import make_docs, write_jsonl
from support.model import model_round_robin, model_streams

SPEC = "tiktoken:r50k_base"
EOT = 50256
PAD = 50255  # distinct from every id of the test words, so padding is recognisable
BOS = 50254


build = functools.partial(run_build, tokenizer=SPEC)


def multiset(contexts):
    return Counter(tuple(c) for c in contexts)


# --------------------------------------------------------------------------------------
# Determinism (DESIGN §2): same inputs and options, same bytes.

OPTS = dict(seqlen=32, chunk_size=8, num_local_cells=5, seed=3)


@pytest.mark.parametrize("fmt", ["npy", "json.gz"])
def test_byte_identical_for_any_threads_and_reruns(small_corpus, tmp_path, fmt):
    one = build(small_corpus, tmp_path / "t1", threads=1, format=fmt, **OPTS)
    build(small_corpus, tmp_path / "t2", threads=2, format=fmt, **OPTS)
    # Another folder, another scratch folder, a memory budget that forces stage 2 to walk the
    # cells in many small groups: none of it may change a byte.
    build(
        small_corpus,
        tmp_path / "t3",
        threads=2,
        format=fmt,
        memory_limit=1,
        local_cell_dir=tmp_path / "scratch",
        **OPTS,
    )
    files = cache.file_bytes(tmp_path / "t1")
    assert one.num_chunks > 5 and len(files) == one.num_chunks + 2
    assert cache.file_bytes(tmp_path / "t2") == files
    assert cache.file_bytes(tmp_path / "t3") == files
    assert sorted(os.listdir(tmp_path / "scratch")) == []  # scratch cleaned up


def test_memory_limit_splits_stage_2_never_its_bytes(small_corpus, tmp_path):
    """Stage 2 spends memory_limit on cell ids (8 bytes each) and on each thread's window of
    contexts gathered ahead (at most half the limit, at most a chunk). Whatever the split
    (a window of one context or of a whole chunk, one group of chunks or many) the bytes
    are the same."""
    ref = build(small_corpus, tmp_path / "ref", threads=2, **OPTS)
    files = cache.file_bytes(tmp_path / "ref")
    context_bytes = OPTS["seqlen"] * 2  # uint16 ids
    figures = {}
    # 1 byte: one context per window, one chunk per group. 2000 bytes: windows of 7 contexts
    # (2000 / 2 / 2 threads / 64 bytes) and groups of (2000 - 2 * 7 * 64) / 8 = 138 ids, about
    # a cell (576 contexts in 5 cells).
    for limit in [1, 2000, None]:
        out = tmp_path / f"m{limit}"
        stats = build(small_corpus, out, threads=2, memory_limit=limit, **OPTS)
        assert cache.file_bytes(out) == files, limit
        figures[limit] = stats.metadata["build"]["stage2"]
        assert figures[limit]["shards"] == ref.num_chunks
    assert figures[1]["gather_window"] == 1 and figures[1]["groups"] == ref.num_chunks
    assert figures[2000]["gather_window"] == 2000 // 2 // 2 // context_bytes == 7
    assert 1 < figures[2000]["groups"] < ref.num_chunks
    assert figures[None]["gather_window"] == OPTS["chunk_size"] and figures[None]["groups"] == 1


@pytest.mark.parametrize("fmt", ["npy", "json.gz"])
def test_seed_changes_order_not_contents(small_corpus, tmp_path, fmt):
    build(small_corpus, tmp_path / "s3", format=fmt, **OPTS)
    build(small_corpus, tmp_path / "s4", format=fmt, **{**OPTS, "seed": 4})
    build(small_corpus, tmp_path / "plain", format=fmt, shuffle=False, **OPTS)
    a, b = cache.read_contexts(tmp_path / "s3"), cache.read_contexts(tmp_path / "plain")
    c = cache.read_contexts(tmp_path / "s4")
    assert len(set(map(tuple, a))) > 100  # the contexts are (nearly) all distinct
    assert a != c and a != b
    assert multiset(a) == multiset(b) == multiset(c)
    # Only the last chunk of a shuffled cache is short.
    sizes = [m["num_sequences"] for m in cache.manifest(tmp_path / "s3")]
    assert all(s == OPTS["chunk_size"] for s in sizes[:-1]) and 0 < sizes[-1] <= OPTS["chunk_size"]


@pytest.mark.slow
def test_byte_identical_with_many_batches_per_file(tmp_path):
    """A file larger than a stage-1 batch (1 MB) is tokenized in parallel pieces that must be
    windowed in file order whatever the thread count."""
    big = write_jsonl(tmp_path / "in" / "big.jsonl", make_docs(3600, 7))
    small = write_jsonl(tmp_path / "in" / "small.jsonl.gz", make_docs(30, 8))
    assert big.stat().st_size > 2_500_000
    opts = dict(seqlen=128, chunk_size=64, num_local_cells=9, seed=11)
    build([big, small], tmp_path / "t1", threads=1, **opts)
    build([big, small], tmp_path / "t2", threads=2, **opts)
    assert cache.file_bytes(tmp_path / "t1") == cache.file_bytes(tmp_path / "t2")
    build([big, small], tmp_path / "plain", threads=2, shuffle=False, **opts)
    expected, _ = model_streams(
        [make_docs(3600, 7), make_docs(30, 8)], tokshuf.Tokenizer(SPEC).encode, 128, "stitch", None, EOT, EOT
    )
    got = [c.tolist() for ch in cache.read_chunks(tmp_path / "plain") for c in ch]
    assert got == [c for ch in model_round_robin(expected, 64, stitched=True) for c in ch]


# --------------------------------------------------------------------------------------
# Windowing and tails, against the model, with hypothesis.

WORDS = st.sampled_from(
    ["the", " cat", " sat", "on", " the", " mat", ".", "\n", "  ", " 42", " don't", "日本", " é", "<|endoftext|>", "!"]
)
DOC = st.lists(WORDS, max_size=10).map("".join)  # "" is an empty document (skipped, counted)
FILES = st.lists(st.lists(DOC, max_size=6), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def encode():
    return tokref.tiktoken_reference("r50k_base").encode_ordinary


@given(
    files=FILES,
    seqlen=st.integers(2, 12),
    chunk_size=st.integers(1, 4),
    tail=st.sampled_from(["stitch", "pad", "drop"]),
    bos=st.booleans(),
    fmt=st.sampled_from(["npy", "json.gz"]),
)
def test_windowing_matches_model(encode, files, seqlen, chunk_size, tail, bos, fmt):
    streams, stats = model_streams(files, encode, seqlen, tail, BOS if bos else None, PAD, EOT)
    assert not {PAD, BOS} & {t for docs in files for d in docs for t in encode(d)}
    expected = model_round_robin(streams, chunk_size, stitched=tail == "stitch")
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_jsonl(Path(tmp) / "in" / f"f{i}.jsonl", docs) for i, docs in enumerate(files)]
        out = Path(tmp) / "cache"
        kw = dict(
            seqlen=seqlen,
            chunk_size=chunk_size,
            tail=tail,
            format=fmt,
            pad_id=PAD,
            bos=bos,
            bos_id=BOS if bos else None,
        )
        result = build(paths, out, shuffle=False, **kw)
        got = [[c.tolist() for c in ch] for ch in cache.read_chunks(out)]
        assert got == expected
        meta = result.metadata
        assert meta["chunk_sizes"] == [len(c) for c in expected]
        for key in ("num_documents", "empty_documents", "num_tokens", "num_padding_tokens", "dropped_tokens"):
            assert meta[key] == stats[key], key
        assert meta["num_contexts"] == sum(map(len, expected))
        # Padding only ever completes a partial context.
        everything = [c for ch in got for c in ch]
        assert not any(all(t == PAD for t in c) for c in everything)
        assert sum(PAD in c for c in everything) <= (1 if tail == "stitch" else len(files) if tail == "pad" else 0)
        # Shuffling permutes the same contexts.
        build(paths, Path(tmp) / "shuffled", seed=5, num_local_cells=3, **kw)
        assert multiset(cache.read_contexts(Path(tmp) / "shuffled")) == multiset(everything)


@given(
    docs=st.lists(DOC, max_size=12),
    seqlen=st.integers(2, 9),
    tail=st.sampled_from(["stitch", "pad", "drop"]),
    bos=st.booleans(),
)
def test_removing_padding_and_splitting_on_eot_gives_documents_back(encode, docs, seqlen, tail, bos):
    """Model-free: one input file, read the cache, strip padding, split on EOT."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_jsonl(Path(tmp) / "one.jsonl", docs)
        build(
            path,
            Path(tmp) / "c",
            shuffle=False,
            seqlen=seqlen,
            chunk_size=2,
            tail=tail,
            pad_id=PAD,
            bos=bos,
            bos_id=BOS if bos else None,
        )
        contexts = cache.read_contexts(Path(tmp) / "c")
    # With one file the only padded context is the tail (placed last in any case).
    padded = [c for c in contexts if PAD in c]
    assert len(padded) <= (0 if tail == "drop" else 1)
    stream = [t for c in contexts if PAD not in c for t in c] + [t for c in padded for t in c]
    while stream and stream[-1] == PAD:
        stream.pop()
    assert PAD not in stream
    prefix = [BOS] if bos else []
    docs_ids = [prefix + encode(d) + [EOT] for d in docs if d]
    flat = [t for d in docs_ids for t in d]
    if tail == "drop":
        assert stream == flat[: len(flat) // seqlen * seqlen]
    else:
        assert stream == flat
        pieces = []
        for t in stream:
            if not pieces or pieces[-1][-1:] == [EOT]:
                pieces.append([])
            pieces[-1].append(t)
        assert pieces == docs_ids


def test_bos_needs_an_id_when_the_tokenizer_has_none(small_corpus, tmp_path):
    with pytest.raises(tokshuf.ConfigError, match="BOS"):
        build(small_corpus, tmp_path / "c", bos=True, **OPTS)


def test_neox_defaults_pad_and_eot(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["one two three", "four"])
    stats = build(path, tmp_path / "c", tokenizer=str(tokref.NEOX_JSON), seqlen=64, tail="pad")
    meta = stats.metadata
    assert (meta["eot_id"], meta["pad_id"], meta["bos_id"]) == (0, 1, None)
    (ctx,) = cache.read_contexts(tmp_path / "c")
    ids = tokref.neox_reference().encode_batch(["one two three", "four"], add_special_tokens=False)
    real = ids[0].ids + [0] + ids[1].ids + [0]
    assert ctx == real + [1] * (64 - len(real))


# --------------------------------------------------------------------------------------
# The format as other tools read it (DESIGN §3).


@pytest.fixture
def npy_cache(small_corpus, tmp_path):
    build(small_corpus, tmp_path / "npy", seqlen=50, chunk_size=16, num_local_cells=4)
    return tmp_path / "npy"


# Stock webdataset leaves its shard files for the garbage collector to close.
wds_unclosed = pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
)


@wds_unclosed
def test_stock_webdataset_reads_every_context(npy_cache):
    import webdataset as wds

    urls = [str(npy_cache / f"{m['shard']}.tar") for m in cache.manifest(npy_cache)]
    samples = list(wds.WebDataset(urls, shardshuffle=False).decode())
    expected = cache.read_contexts(npy_cache)
    assert len(samples) == len(expected) == cache.metadata(npy_cache)["num_contexts"]
    for s, e in zip(samples, expected):
        assert isinstance(s["npy"], np.ndarray) and s["npy"].dtype == np.uint16
        assert s["npy"].tolist() == e
    keys = [s["__key__"] for s in samples]
    assert len(set(keys)) == len(keys) and not any("." in k for k in keys)
    del samples
    gc.collect()  # webdataset's unclosed files are reported here, under this test's filter


@wds_unclosed
def test_open_lm_reads_json_gz_including_the_last_shard(small_corpus, tmp_path):
    """The way open_lm reads `--data-key json.gz`: shards from the manifest, then
    tarfile_to_samples -> decode -> rename(json="json.gz") -> to_tuple("json")."""
    import webdataset as wds

    out = tmp_path / "jg"
    build(small_corpus, out, seqlen=50, chunk_size=16, num_local_cells=4, format="json.gz")
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    urls = [os.path.join(out, m["shard"] + ".tar") for m in manifest]
    assert manifest[-1]["num_sequences"] < 16  # a short last shard
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.tarfile_to_samples(),
        wds.decode(),
        wds.rename(json="json.gz"),
        wds.to_tuple("json"),
    )
    got = [x[0] for x in pipeline]
    assert len(got) == sum(m["num_sequences"] for m in manifest)
    assert got == cache.read_contexts(out)
    assert all(isinstance(x, list) and len(x) == 50 for x in got)
    # The same contexts as the npy cache of the same build.
    build(small_corpus, tmp_path / "npy", seqlen=50, chunk_size=16, num_local_cells=4)
    assert got == cache.read_contexts(tmp_path / "npy")
    del pipeline
    gc.collect()  # webdataset's unclosed files are reported here, under this test's filter


@pytest.mark.parametrize(
    "tokenizer,seqlen,dtype", [(SPEC, 50, "uint16"), (SPEC, 2049, "uint16"), ("tiktoken:cl100k_base", 253, "uint32")]
)
def test_npy_members_at_fixed_stride(small_corpus, tmp_path, tokenizer, seqlen, dtype):
    out = tmp_path / "c"
    build(small_corpus, out, tokenizer=tokenizer, seqlen=seqlen, chunk_size=7, num_local_cells=3)
    meta = cache.metadata(out)
    assert meta["dtype"] == dtype
    dtype = np.dtype(dtype)
    reference = io.BytesIO()
    np.save(reference, np.zeros(seqlen, dtype=dtype.newbyteorder("<")))
    data_len = len(reference.getvalue())
    stride = 512 + -(-data_len // 512) * 512
    manifest = cache.manifest(out)
    for k, m in enumerate(manifest):
        path = out / f"{m['shard']}.tar"
        raw = path.read_bytes()
        assert len(raw) == m["num_sequences"] * stride + 1024 == m["bytes"]
        assert raw[-1024:] == bytes(1024)
        with tarfile.open(path, "r:") as tar:
            members = tar.getmembers()
        assert len(members) == m["num_sequences"]
        for i, mem in enumerate(members):
            assert mem.offset == i * stride and mem.offset_data == i * stride + 512
            assert mem.name == f"{k:08d}_{i:08d}.npy"
            assert (mem.size, mem.mtime, mem.uid, mem.gid, mem.mode) == (data_len, 0, 0, 0, 0o644)
            assert mem.type == tarfile.REGTYPE and not mem.pax_headers
            # Byte-identical to what numpy.save writes for the same array.
            body = raw[mem.offset_data : mem.offset_data + data_len]
            again = io.BytesIO()
            np.save(again, np.load(io.BytesIO(body)))
            assert again.getvalue() == body


def test_manifest_and_metadata_fields(npy_cache):
    meta = cache.metadata(npy_cache)
    manifest = cache.manifest(npy_cache)
    for key in (
        "format_version",
        "status",
        "tokenizer",
        "eot_id",
        "pad_id",
        "bos_id",
        "seqlen",
        "dtype",
        "chunk_size",
        "num_chunks",
        "num_contexts",
        "num_documents",
        "num_tokens",
        "seed",
        "tail",
        "format",
        "inputs",
        "bytes_in",
        "skipped",
        "build",
    ):
        assert key in meta, key
    assert meta["status"] == "complete" and meta["num_chunks"] == len(manifest)
    assert set(meta["tokenizer"]) >= {"spec", "sha256", "vocab_size"}
    assert meta["inputs"] == sorted(meta["inputs"], key=lambda f: f["path"])
    assert set(meta["build"]["durations"]) >= {"tokenize_s", "write_s"}
    for k, m in enumerate(manifest):
        assert m["shard"] == f"shard_{k:08d}"
        data = (npy_cache / f"{m['shard']}.tar").read_bytes()
        import hashlib

        assert m["bytes"] == len(data) and m["sha256"] == hashlib.sha256(data).hexdigest()
    assert sum(m["num_tokens"] for m in manifest) == meta["num_tokens"]
    assert sorted(os.listdir(npy_cache)) == ["manifest.jsonl"] + [f"{m['shard']}.tar" for m in manifest] + [
        "tokshuf.json"
    ]


# --------------------------------------------------------------------------------------
# Output folder rules.


def test_foreign_folder_is_rejected(small_corpus, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(tokshuf.OutputExistsError):
        build(small_corpus, out, **OPTS)
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_empty_existing_folder_is_fine(small_corpus, tmp_path):
    (tmp_path / "empty").mkdir()
    assert build(small_corpus, tmp_path / "empty", **OPTS).num_contexts > 0


def test_a_complete_cache_with_a_damaged_shard_is_not_returned_as_built(small_corpus, tmp_path):
    out = tmp_path / "c"
    build(small_corpus, out, **OPTS)
    shard = out / "shard_00000000.tar"
    shard.write_bytes(shard.read_bytes()[:-512])
    with pytest.raises(tokshuf.CacheCorruptError, match="says complete, but the cache is not"):
        build(small_corpus, out, **OPTS)
    build(small_corpus, out, overwrite=True, **OPTS)
    assert tokshuf.verify(out, full=True).ok


def test_complete_build_returns_at_once(small_corpus, tmp_path):
    out = tmp_path / "c"
    first = build(small_corpus, out, **OPTS)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = build(small_corpus, out, threads=1, **OPTS)
    assert again.metadata == first.metadata
    assert (again.num_chunks, again.num_contexts, again.num_tokens) == (
        first.num_chunks,
        first.num_contexts,
        first.num_tokens,
    )
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes


def test_other_options_in_a_finished_folder_are_rejected(small_corpus, tmp_path):
    out = tmp_path / "c"
    build(small_corpus, out, **OPTS)
    with pytest.raises(tokshuf.OutputExistsError, match="seed"):
        build(small_corpus, out, **{**OPTS, "seed": 99})
    build(small_corpus, out, overwrite=True, **{**OPTS, "seed": 99})
    assert cache.metadata(out)["seed"] == 99


def test_cli_quick_start(tmp_path):
    """The README's quick start command, on the committed sample."""
    import subprocess
    import sys

    sample = Path(__file__).parent / "data" / "sample"
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "tokshuf", "build", "--input", str(sample), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    meta = cache.metadata(out)
    assert meta["status"] == "complete" and meta["num_documents"] == sum(
        p.read_bytes().count(b"\n") for p in sample.glob("*.jsonl")
    )
    assert "tokshuf:" in r.stdout
