"""``shuffle_only`` (``--shuffle-only``): tar shards of contexts, a tokshuf cache's or
tokshuf-rs's, shuffled again into a new cache. The new order is DESIGN §5's with each shard an
input file and each member a context in tar order (checked against the pure-Python model),
whatever the member format or thread count, and the build resumes like any other."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import uuid
from pathlib import Path
from typing import List

import numpy as np
import pytest
import tokshuf
from support import model
from support.build import build, run_to_pause
from support.cache import assert_same_cache, metadata, read_chunk, read_contexts
from support.corpus import three_files

SEQLEN = 32
# Padding id 0 ("!", which the corpus never holds) rather than EOT: padding is then exactly the
# run of it after the last EOT, so the figures of a reshuffled cache are its source's.
PAD = 0
OPTS = dict(seqlen=SEQLEN, chunk_size=10, num_local_cells=3, seed=5, pad_id=PAD, progress=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A tokshuf cache of short chunks: many shards to shuffle together."""
    root = tmp_path_factory.mktemp("shuffle-only")
    build(three_files(root / "in"), root / "cache", seqlen=SEQLEN, chunk_size=7, pad_id=PAD)
    return root / "cache"


def shard_contexts(shards: List[Path]) -> List[List[List[int]]]:
    """Each shard's contexts in tar order: the streams of a shuffle-only build."""
    return [[c.tolist() for c in read_chunk(p)] for p in sorted(shards)]


def expected(streams, seed: int, cells: int, chunk_size: int) -> List[List[int]]:
    return [c for chunk in model.model_shuffle(streams, seed, cells, chunk_size) for c in chunk]


@pytest.mark.parametrize("fmt", ["npy", "json.gz"])
def test_reshuffled_cache_is_the_model_shuffle_of_its_shards(source, tmp_path, fmt):
    shards = sorted(source.glob("shard_*.tar"))
    stats = build([source], tmp_path / "out", shuffle_only=True, format=fmt, **OPTS)
    want = expected(shard_contexts(shards), seed=5, cells=3, chunk_size=10)
    assert read_contexts(tmp_path / "out") == want
    meta = stats.metadata
    src = metadata(source)
    assert meta["recipe"]["input_kind"] == "shards"
    assert [f["path"] for f in meta["inputs"]] == [p.name for p in shards]
    # Documents end at EOTs and padding trails the last one: the source's own figures.
    assert src["num_padding_tokens"] > 0
    for key in ("num_contexts", "num_documents", "num_tokens", "num_padding_tokens"):
        assert meta[key] == src[key], key
    assert sorted(map(tuple, want)) == sorted(map(tuple, read_contexts(source)))


def test_json_gz_shards_and_thread_counts_give_the_same_cache(source, tmp_path):
    # json.gz shards of a cache built the same way hold the same contexts as npy ones.
    build(
        three_files(tmp_path / "in"), tmp_path / "json-src", format="json.gz", seqlen=SEQLEN, chunk_size=7, pad_id=PAD
    )
    build([source], tmp_path / "a", shuffle_only=True, threads=1, **OPTS)
    build([tmp_path / "json-src"], tmp_path / "b", shuffle_only=True, threads=2, **OPTS)
    assert read_contexts(tmp_path / "a") == read_contexts(tmp_path / "b")
    assert (tmp_path / "a" / "manifest.jsonl").read_bytes() == (tmp_path / "b" / "manifest.jsonl").read_bytes()


def tokshuf_rs_shard(path: Path, chunk: int, contexts: List[List[int]]) -> Path:
    """A shard as tokshuf-rs writes it: GNU tar, members `{chunk}_{index}_{uuid}.json.gz`."""
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for i, ctx in enumerate(contexts):
            data = gzip.compress(json.dumps(ctx).encode())
            info = tarfile.TarInfo(f"{chunk:08d}_{i:08d}_{uuid.uuid4()}.json.gz")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tokshuf_rs_shards_are_reshuffled_exactly(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "rs").mkdir()
    shards = [
        tokshuf_rs_shard(tmp_path / "rs" / f"shard_{k:08d}.tar", k, rng.integers(0, 50277, size=(n, SEQLEN)).tolist())
        for k, n in enumerate([9, 4, 12])
    ]
    (tmp_path / "rs" / "manifest.jsonl").write_text("")  # not a tar: not an input
    neox = str(Path(__file__).parent / "data" / "gpt-neox-20b.json")
    build([tmp_path / "rs"], tmp_path / "out", shuffle_only=True, tokenizer=neox, **OPTS)
    assert read_contexts(tmp_path / "out") == expected(shard_contexts(shards), seed=5, cells=3, chunk_size=10)


def test_a_killed_reshuffle_resumes_to_the_same_bytes(source, tmp_path):
    opts = dict(OPTS, shuffle_only=True, threads=1)
    point = run_to_pause([str(source)], tmp_path / "out", opts, "stage1.file:2", tmp_path / "trace")
    assert point == "stage1.file:2"
    build([source], tmp_path / "out", **opts)
    build([source], tmp_path / "clean", **opts)
    assert_same_cache(tmp_path / "out", tmp_path / "clean")


def test_shards_that_do_not_fit_the_options_are_refused(source, tmp_path):
    (tmp_path / "rs").mkdir()
    tokshuf_rs_shard(tmp_path / "rs" / "s.tar", 0, [[1] * SEQLEN])
    with pytest.raises(tokshuf.ConfigError, match=r"member 1 \(00000000_00000000_.*\) holds 32 ids, not seqlen=33"):
        build([tmp_path / "rs"], tmp_path / "a", shuffle_only=True, seqlen=33)
    big = tmp_path / "big"
    big.mkdir()
    tokshuf_rs_shard(big / "s.tar", 0, [[60000] * SEQLEN])
    with pytest.raises(tokshuf.ConfigError, match="id 60000, outside the tokenizer's 50257 ids"):
        build([big], tmp_path / "b", shuffle_only=True, seqlen=SEQLEN)
    with pytest.raises(tokshuf.ConfigError, match="shuffle=False"):
        build([source], tmp_path / "c", shuffle_only=True, shuffle=False, seqlen=SEQLEN)
    bad = tmp_path / "bad" / "x.tar"
    bad.parent.mkdir()
    bad.write_bytes(b"not a tar file at all" * 40)
    with pytest.raises(tokshuf.CacheCorruptError, match=r"x\.tar: not a readable tar file"):
        build([bad], tmp_path / "d", shuffle_only=True, seqlen=SEQLEN)
    (tmp_path / "empty").mkdir()
    with pytest.raises(tokshuf.InputNotFoundError, match=r"no \.tar files"):
        build([tmp_path / "empty"], tmp_path / "e", shuffle_only=True, seqlen=SEQLEN)


@pytest.mark.parametrize(
    "opts, message",
    [
        (dict(seqlen=33), "the shards have seqlen 32, this build 33"),
        (dict(pad_id=7), "the shards have pad_id 0, this build 7"),
        (dict(tokenizer="tiktoken:cl100k_base"), "made with tokenizer tiktoken:r50k_base, not tiktoken:cl100k_base"),
    ],
)
def test_the_source_caches_own_record_is_checked(source, tmp_path, opts, message):
    # Shards of another tokenizer whose ids all fit this vocabulary were mixed in silently,
    # under this tokenizer's name; the tokshuf.json beside them says what they are.
    with pytest.raises(tokshuf.ConfigError, match=message):
        build([source], tmp_path / "out", shuffle_only=True, **dict(OPTS, **opts))


def test_block_layouts_are_refused_as_inputs_by_name(tmp_path):
    build(three_files(tmp_path / "in"), tmp_path / "blocks", seqlen=SEQLEN, chunk_size=8, format="blocks")
    with pytest.raises(tokshuf.ConfigError, match='format "blocks"'):
        build([tmp_path / "blocks"], tmp_path / "out", shuffle_only=True, seqlen=SEQLEN)


def test_padding_is_counted_by_the_readers_rule(tmp_path):
    # Padding is the run of pad_id right after an EOT; a run of it after text is text.
    (tmp_path / "rs").mkdir()
    eot, pad = 50256, 262  # 262: " the", a text id
    text_end = [5] * (SEQLEN - 3) + [pad] * 3
    padded = [5, 6, eot] + [pad] * (SEQLEN - 3)
    tokshuf_rs_shard(tmp_path / "rs" / "s.tar", 0, [text_end, padded])
    meta = build([tmp_path / "rs"], tmp_path / "out", shuffle_only=True, **dict(OPTS, pad_id=pad)).metadata
    assert (meta["num_padding_tokens"], meta["num_tokens"], meta["num_documents"]) == (SEQLEN - 3, SEQLEN + 3, 1)


def test_tar_entries_that_are_no_context_are_refused_not_skipped(tmp_path):
    def npy(ids):
        buf = io.BytesIO()
        np.save(buf, np.array(ids, dtype="<u2"))
        return buf.getvalue()

    def shard(path: Path, extra: tarfile.TarInfo) -> Path:
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(2):
                data = npy([i + 1] * SEQLEN)
                info = tarfile.TarInfo(f"00000000_{i:08d}.npy")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            tar.addfile(extra, io.BytesIO(npy([9] * SEQLEN)) if extra.size else None)
        return path

    # A contiguous file ('7') is a regular file to tar: its context counts.
    (tmp_path / "c").mkdir()
    cont = tarfile.TarInfo("00000000_00000002.npy")
    cont.type, cont.size = tarfile.CONTTYPE, len(npy([9] * SEQLEN))
    stats = build([shard(tmp_path / "c" / "s.tar", cont)], tmp_path / "out", shuffle_only=True, **OPTS)
    assert stats.num_contexts == 3
    # A hard link holds no data of its own: skipping it lost a context without a word.
    (tmp_path / "l").mkdir()
    link = tarfile.TarInfo("00000000_00000002.npy")
    link.type, link.linkname = tarfile.LNKTYPE, "00000000_00000000.npy"
    with pytest.raises(tokshuf.CacheCorruptError, match=r"member 3 .*: a Link entry, not a context"):
        build([shard(tmp_path / "l" / "s.tar", link)], tmp_path / "out2", shuffle_only=True, **OPTS)


def test_options_that_shape_no_shard_are_not_part_of_the_recipe(source, tmp_path):
    # A reshuffle parses no JSON and cuts no tails (--dclm-compat passes tail="pad" anyway).
    meta = build([source], tmp_path / "out", shuffle_only=True, tail="pad", text_key="body", **OPTS).metadata
    assert (meta["recipe"]["tail"], meta["recipe"]["text_key"]) == ("stitch", "text")
    assert build([source], tmp_path / "out", shuffle_only=True, **OPTS).metadata == meta
