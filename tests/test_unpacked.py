"""Unpacked caches (packing="none", docs/format.md §4.2): what the build writes (each bin's
examples and order against a pure-Python reference, stock WebDataset and tarfile reading every
member, the .idx sidecars), and what the reader yields (the bin schedule against its reference,
the same global batches for every world size, seek and resume in a new process)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import numpy as np
import pytest
import tokshuf
from support.build import build
from support.cache import assert_same_cache
from support.corpus import make_docs, write_jsonl
from support.tokref import tiktoken_reference
from support.unpacked import (
    QUANTUM,
    member_arrays,
    reference_batch,
    reference_bins,
    reference_schedule,
    tar_offsets,
)

SPEC = "tiktoken:r50k_base"
EOT = 50256
BOUNDS = [16, 40, 64]
OPTS = dict(tokenizer=SPEC, seqlen=64, chunk_size=8, packing="none", bins=BOUNDS, threads=2, seed=5)


def docs_per_file(n_files: int = 3) -> List[List[str]]:
    return [make_docs(40 + 15 * f, 30 + f) for f in range(n_files)]


def corpus(root: Path) -> List[Path]:
    return [write_jsonl(root / f"p{f}.jsonl", docs) for f, docs in enumerate(docs_per_file())]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    out = root / "cache"
    build(corpus(root / "in"), out, num_local_cells=3, **OPTS)
    return out


def test_bins_hold_every_piece_in_the_section5_order(cache_dir):
    enc = tiktoken_reference("r50k_base")
    ids = [[enc.encode_ordinary(d) + [EOT] for d in docs] for docs in docs_per_file()]
    want = reference_bins(ids, BOUNDS, 64, seed=5, cells=3, chunk=8)
    meta = json.loads((cache_dir / "tokshuf.json").read_text())
    assert meta["packing"] == "none" and meta["recipe"]["bins"] == BOUNDS
    assert [b["max_len"] for b in meta["bins"]] == BOUNDS
    for k, chunks in enumerate(want):
        d = cache_dir / f"bin_{k:02d}"
        lines = [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]
        assert [x["num_sequences"] for x in lines] == [len(c) for c in chunks]
        assert meta["bins"][k]["num_examples"] == sum(len(c) for c in chunks) > 0
        for c, examples in enumerate(chunks):
            tar = d / f"shard_{c:08d}.tar"
            got = member_arrays(tar)
            assert [g.tolist() for g in got] == examples
            assert lines[c]["num_tokens"] == sum(map(len, examples))
            # The sidecar holds exactly the member offsets the standard tar reader finds.
            idx = np.fromfile(d / f"shard_{c:08d}.idx", dtype="<u8").tolist()
            assert idx == tar_offsets(tar)
            lo = BOUNDS[k - 1] if k else 0
            assert all(lo < len(g) <= BOUNDS[k] for g in got)
    assert meta["num_tokens"] == sum(len(x) for docs in ids for x in docs)
    assert meta["packing_stats"]["documents_split"] == sum(len(x) > 64 for docs in ids for x in docs)


# Stock webdataset leaves its shard files for the garbage collector to close.
@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
)
def test_stock_webdataset_decodes_every_member(cache_dir):
    wds = pytest.importorskip("webdataset")
    urls = sorted(str(p) for p in cache_dir.glob("bin_*/shard_*.tar"))
    got = [s["npy"] for s in wds.WebDataset(urls, shardshuffle=False).decode()]
    meta = json.loads((cache_dir / "tokshuf.json").read_text())
    assert len(got) == meta["num_contexts"]
    assert sum(len(a) for a in got) == meta["num_tokens"]
    assert all(a.dtype == np.uint16 and a.ndim == 1 for a in got)


def test_byte_identical_across_thread_counts_and_memory_budgets(tmp_path):
    inputs = corpus(tmp_path / "in")
    one, two = tmp_path / "one", tmp_path / "two"
    build(inputs, one, num_local_cells=3, **dict(OPTS, threads=1), memory_limit=4 << 10)
    build(inputs, two, num_local_cells=3, **OPTS)
    assert_same_cache(one, two)


def test_shuffle_false_keeps_file_order_within_each_bin(tmp_path):
    inputs = corpus(tmp_path / "in")
    a, b = tmp_path / "a", tmp_path / "b"
    build(inputs, a, shuffle=False, **OPTS)
    build(inputs, b, shuffle=False, **dict(OPTS, threads=1))
    assert_same_cache(a, b)
    r = tokshuf.Reader(a, batch_size=4)
    assert next(r).tokens.shape[0] == 4


def test_bin_size_makes_equal_width_bins(tmp_path):
    out = tmp_path / "c"
    stats = build(corpus(tmp_path / "in")[:1], out, **dict(OPTS, bins=None, bin_size=24))
    assert stats.metadata["recipe"]["bins"] == [24, 48, 64]
    stats = build(corpus(tmp_path / "in")[:1], tmp_path / "d", **dict(OPTS, bins=None))
    assert stats.metadata["recipe"]["bins"] == list(range(4, 65, 4))  # seqlen / 16


def test_schedule_matches_the_reference(cache_dir):
    cache = tokshuf.UnpackedCache(cache_dir)
    counts = [b["num_examples"] for b in cache.bins]
    reader = tokshuf.Reader(cache, batch_size=4, seed=3, ideal_readers=2, prefetch=0)
    want = reference_schedule(counts, 60)
    assert [tuple(reader._core.bin_of(b)) for b in range(60)] == want
    for b in range(60):
        got = next(reader)
        k, examples = reference_batch(cache, counts, b, 4, r_star=2, seed=3)
        assert got.bin == k
        assert got.lengths.tolist() == [len(e) for e in examples]
        assert got.tokens.shape == (4, max(map(len, examples)))
        for row, e in zip(range(4), examples):
            assert got.tokens[row, : len(e)].tolist() == e.tolist()
            assert (got.tokens[row, len(e) :] == cache.metadata["pad_id"]).all()
        assert (got.attention_mask == (np.arange(got.tokens.shape[1]) < got.lengths[:, None])).all()
        assert got.num_tokens == sum(map(len, examples))


def test_bins_are_drawn_in_exact_proportion_over_each_period(cache_dir):
    cache = tokshuf.UnpackedCache(cache_dir)
    counts = [b["num_examples"] for b in cache.bins]
    core = tokshuf.Reader(cache, batch_size=8)._core
    from support.blend import ref_quantise

    q, _ = ref_quantise([float(c) for c in counts], QUANTUM)
    for period in (0, 1, 7):
        drawn = np.bincount([core.bin_of(period * QUANTUM + j)[0] for j in range(QUANTUM)], minlength=len(counts))
        assert drawn.tolist() == q
        # Bin k's own counter runs 0.. q_k - 1 in period 0 and continues in the next ones.
        first = [core.bin_of(period * QUANTUM + j) for j in range(QUANTUM)]
        for k in range(len(counts)):
            assert sorted(c for kk, c in first if kk == k) == list(range(period * q[k], (period + 1) * q[k]))


@pytest.mark.parametrize("prefetch", [0, 3])
def test_same_global_batches_for_any_world_size(cache_dir, prefetch):
    B = 8
    one = tokshuf.Reader(cache_dir, batch_size=B, ideal_readers=3, prefetch=prefetch)
    want = [next(one) for _ in range(25)]
    for R in (2, 4, 8):
        ranks = [
            tokshuf.Reader(cache_dir, batch_size=B, rank=r, world_size=R, ideal_readers=3, prefetch=prefetch)
            for r in range(R)
        ]
        for w in want:
            parts = [next(x) for x in ranks]
            assert {p.tokens.shape[1] for p in parts} == {w.tokens.shape[1]}  # one width on every rank
            for r, p in enumerate(parts):
                assert np.array_equal(p.tokens, w.tokens[r::R]) and np.array_equal(p.lengths, w.lengths[r::R])
                assert p.bin == w.bin and p.num_tokens == w.num_tokens


def test_pad_to_bin_pads_to_the_bins_bound(cache_dir):
    r = tokshuf.Reader(cache_dir, batch_size=4, pad_to="bin", dtype="int64")
    for _ in range(10):
        b = next(r)
        assert b.tokens.shape[1] == BOUNDS[b.bin] and b.tokens.dtype == np.int64


SCRIPT = """
import hashlib, json, sys, tokshuf
state = json.loads(sys.argv[2])
r = tokshuf.Reader(sys.argv[1], batch_size=8, world_size=1, ideal_readers=3)
r.load_state_dict(state)
out = [hashlib.sha256(next(r).tokens.tobytes()).hexdigest() for _ in range(4)]
print(json.dumps([out, r.tokens_seen]))
"""


def test_seek_and_resume_in_a_new_process(cache_dir):
    r = tokshuf.Reader(cache_dir, batch_size=8, ideal_readers=3)
    first = [next(r) for _ in range(7)]
    state = json.loads(json.dumps(r.state_dict()))
    after = [next(r) for _ in range(4)]
    assert state["tokens_seen"] == sum(b.num_tokens for b in first)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache_dir), json.dumps(state)], capture_output=True, text=True, check=True
    )
    hashes, seen = json.loads(out.stdout)
    assert hashes == [hashlib.sha256(b.tokens.tobytes()).hexdigest() for b in after]
    assert seen == r.tokens_seen
    # Seek by step or by a batch's first example reads the same batches, in O(1).
    s = tokshuf.Reader(cache_dir, batch_size=8, ideal_readers=3)
    s.seek(step=7)
    assert np.array_equal(next(s).tokens, after[0].tokens)
    s.seek(example=10**15 * 8)
    assert next(s).tokens.shape[0] == 8
    assert np.array_equal(s.batch_at(3).tokens, first[3].tokens)
    other = tokshuf.Reader(cache_dir, batch_size=8, ideal_readers=4)
    with pytest.raises(tokshuf.StateMismatchError):
        other.load_state_dict(state)


def test_what_does_not_apply_is_refused(cache_dir):
    r = tokshuf.Reader(cache_dir, batch_size=8)
    with pytest.raises(tokshuf.ConfigError, match="multiple of batch_size"):
        r.seek(example=3)
    with pytest.raises(tokshuf.ConfigError, match="by step"):
        r.seek(tokens=64)
    for kw in (dict(single_pass=True), dict(boundaries="segment_ids"), dict(follow=True), dict(pad_to="widest")):
        with pytest.raises(tokshuf.ConfigError):
            tokshuf.Reader(cache_dir, batch_size=8, **kw)
    with pytest.raises(tokshuf.ConfigError, match="unpacked"):
        tokshuf.Cache(cache_dir)
    with pytest.raises(tokshuf.ConfigError, match="unpacked"):
        tokshuf.Blend([(cache_dir, 1.0)])
    with pytest.raises(tokshuf.ConfigError, match="unpacked cache's batches"):
        next(r.pairs())
    with pytest.raises(tokshuf.ConfigError, match="UnpackedBatch"):
        tokshuf.shift_targets(next(r))
    from tokshuf.grain import DataSource

    with pytest.raises(tokshuf.ConfigError, match="unpacked"):
        DataSource(cache_dir)
    cache = tokshuf.UnpackedCache(cache_dir)
    for args in ((-1, 0, 0), (0, -1, 0), (0, 0, 10**9), (99, 0, 0)):
        with pytest.raises(IndexError):
            cache.example(*args)
    with pytest.raises(IndexError):
        cache.lengths(-1)
    with pytest.raises(TypeError):
        cache.example(0, 0, 1.0)


def test_uint16_batches_of_a_uint32_cache_are_refused(tmp_path):
    out = tmp_path / "cache"
    build(corpus(tmp_path / "in"), out, **{**OPTS, "tokenizer": "tiktoken:cl100k_base"})
    assert json.loads((out / "tokshuf.json").read_text())["dtype"] == "uint32"
    with pytest.raises(tokshuf.ConfigError, match="uint16 cannot hold"):
        tokshuf.Reader(out, batch_size=8, dtype="uint16")


@pytest.mark.parametrize(
    "opts, match",
    [
        (dict(bins=[16, 64, 40]), "increasing"),
        (dict(bins=[16, 40]), "seqlen"),
        (dict(bins=[0, 64]), "positive"),
        (dict(bins=[True, 64]), "bins must be"),
        (dict(bin_size=16, bins=[16, 64]), "not both"),
        (dict(bin_size=0, bins=None), "positive"),
        (dict(bin_size=1, bins=None, seqlen=500), "at most 100"),
        (dict(format="json.gz"), "npy"),
        (dict(packing="concat"), 'packing="none"'),
        (dict(pack_window=8), "bestfit"),
    ],
)
def test_bad_bin_options_are_config_errors(tmp_path, opts, match):
    with pytest.raises(tokshuf.ConfigError, match=match):
        build(corpus(tmp_path / "in")[:1], tmp_path / "out", **dict(OPTS, **opts))
    assert not (tmp_path / "out" / "tokshuf.json").exists()


def test_torch_adapter_yields_the_readers_batches(cache_dir):
    torch = pytest.importorskip("torch")
    from tokshuf.torch import ReaderDataset

    r = tokshuf.Reader(cache_dir, batch_size=4)
    want = [next(r) for _ in range(6)]
    ds = ReaderDataset(tokshuf.Reader(cache_dir, batch_size=4), steps=6)
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    assert len(got) == 6
    for g, w in zip(got, want):
        assert torch.equal(g.tokens, torch.from_numpy(w.tokens)) and torch.equal(g.lengths, torch.from_numpy(w.lengths))
        assert torch.equal(g.attention_mask, torch.from_numpy(w.attention_mask)) and g.bin == w.bin
    # The state after those batches counts their real tokens, as the Reader's does: given the
    # count (workers), and from the batches yielded in this process.
    assert ds.state_dict(6)["tokens_seen"] == r.state_dict()["tokens_seen"] == sum(int(w.num_tokens) for w in want)
    here = ReaderDataset(tokshuf.Reader(cache_dir, batch_size=4), steps=6)
    assert len(list(here)) == 6 and here.state_dict() == r.state_dict()


@pytest.mark.parametrize("prefetch", [0, 3])
def test_batches_kept_or_written_by_the_caller_stay_as_read(cache_dir, prefetch):
    """Unpacked batches reuse the buffers of batches the caller is done with (of other widths,
    too): those it keeps, views of them, and batches it writes into must stay as read."""
    steps = 40
    fresh = tokshuf.Reader(cache_dir, batch_size=4, prefetch=0)
    want = [next(fresh).tokens.copy() for _ in range(steps)]
    assert len({w.shape[1] for w in want}) > 1  # several widths: buffers change size
    reader = tokshuf.Reader(cache_dir, batch_size=4, prefetch=prefetch, threads=2)
    kept = []
    for step in range(steps):
        tokens = next(reader).tokens
        if step % 3 == 0:
            kept.append((step, slice(None), tokens))
        elif step % 3 == 1:
            kept.append((step, slice(1, None), tokens[1:]))
        else:
            assert np.array_equal(tokens, want[step])
            tokens[:] = 7
        del tokens
    for step, rows, got in kept:
        assert np.array_equal(got, want[step][rows]), step


def test_verify_passes_and_finds_damage(tmp_path, cache_dir):
    assert tokshuf.verify(cache_dir, full=True).ok
    import shutil

    def damaged(name: str, damage) -> tokshuf.VerifyReport:
        copy = tmp_path / name
        shutil.copytree(cache_dir, copy)
        damage(copy / "bin_01")
        return tokshuf.verify(copy, full=True)

    def flip_idx(d: Path) -> None:
        idx = np.fromfile(d / "shard_00000000.idx", dtype="<u8")
        idx[2] += 512
        idx.tofile(d / "shard_00000000.idx")

    def longer_member(d: Path) -> None:
        # Member 0 claims one id more than it has: its npy header no longer matches its size.
        p = d / "shard_00000000.tar"
        data = bytearray(p.read_bytes())
        at = data.index(b"'shape': (") + len(b"'shape': (")
        end = data.index(b",", at)
        data[at:end] = str(int(data[at:end]) + 1).encode().rjust(end - at)[: end - at]
        p.write_bytes(bytes(data))

    def renamed_member(d: Path) -> None:
        # Member 1 goes by another name of the same length (the index still points at it).
        p = d / "shard_00000000.tar"
        p.write_bytes(p.read_bytes().replace(b"00000000_00000001.npy", b"00000000_00000009.npy", 1))

    cases = {
        "idx offset": (flip_idx, "offset 2"),
        "member name": (renamed_member, "00000000_00000001"),
        "idx missing": (lambda d: (d / "shard_00000000.idx").unlink(), ".idx"),
        "truncated": (
            lambda d: (d / "shard_00000001.tar").write_bytes((d / "shard_00000001.tar").read_bytes()[:-512]),
            "bytes",
        ),
        "member header": (longer_member, "member 0"),
        "bin missing": (lambda d: shutil.rmtree(d), "bin_01/"),
    }
    for name, (damage, fragment) in cases.items():
        report = damaged(name.replace(" ", "_"), damage)
        assert not report.ok, name
        assert any(fragment in p for p in report.problems), (name, report.problems)
    # The reader refuses what verify refuses, with a typed error: at open, or at the example
    # whose member's name or npy header is not what the index and its size say.
    with pytest.raises(tokshuf.CacheCorruptError):
        tokshuf.UnpackedCache(tmp_path / "idx_missing")
    for name, index, fragment in [
        ("member_name", 1, 'member 1 is not named "00000000_00000001.npy"'),
        ("member_header", 0, "member 00000000_00000000.npy: not a 1-D npy array"),
    ]:
        damaged_cache = tokshuf.UnpackedCache(tmp_path / name, check_files=False)
        with pytest.raises(tokshuf.CacheCorruptError, match=re.escape(fragment)):
            damaged_cache.example(1, 0, index)
        assert len(tokshuf.UnpackedCache(cache_dir).example(1, 0, index)) > 0


def test_inspect_shows_bins_and_the_length_histogram(cache_dir):
    out = subprocess.run(
        [sys.executable, "-m", "tokshuf", "inspect", str(cache_dir), "-n", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    meta = json.loads((cache_dir / "tokshuf.json").read_text())
    assert "3 length bins" in out
    for k, b in enumerate(meta["bins"]):
        lo = meta["bins"][k - 1]["max_len"] + 1 if k else 1
        assert f"{lo}..{b['max_len']}" in out and f"{b['num_examples']:,}" in out
    assert f"every example: {meta['num_contexts']:,}" in out
    counts = [int(line.split()[1].replace(",", "")) for line in out.splitlines() if ".." in line and "#" in line]
    assert sum(counts) == meta["num_contexts"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "points", [["stage1.file", "plan", "stage2.shard:3"], ["stage2.tmp:9", "atomic:manifest.jsonl:2"]]
)
def test_killed_build_resumes_identically(tmp_path, points):
    from support.build import run_to_pause

    inputs = corpus(tmp_path / "in")
    opts = dict(OPTS, num_local_cells=2, progress=False)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **opts)
    got = tmp_path / "resumed"
    for point in points:
        assert run_to_pause(inputs, got, opts, point, tmp_path / "trace.txt") == point
    tokshuf.build_cache(inputs, got, **opts)
    assert_same_cache(got, want)
