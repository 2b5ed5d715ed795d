"""The block formats (docs/format.md §3): ``blocks`` (2-D npy members of ``block_size``
contexts) and ``blocks.zst`` (the same arrays zstd-compressed) hold exactly the contexts of the
npy format, in the same order, read back by tokshuf, by tarfile + NumPy (+ zstandard) alone,
and (``blocks``) by stock webdataset."""

from __future__ import annotations

import gc
import glob
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tokshuf
import zstandard
from support.corpus import make_docs, write_jsonl
from support.reader import addresses, reference_examples, write_cache

SEQLEN, CHUNK = 48, 10
# (format, block_size, shuffle): blocks of 4 end every chunk of 10 in a short block; the
# default 64 makes one block per chunk.
CASES = [("blocks", 4, True), ("blocks.zst", 4, True), ("blocks", None, False), ("blocks.zst", None, False)]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One corpus in npy and in each block format (blocks of 4: every chunk ends in a short
    block; blocks of 64: one block per chunk), shuffled and not."""
    root = tmp_path_factory.mktemp("layouts")
    files = [write_jsonl(root / "in" / f"{k}.jsonl", make_docs(12 + 5 * k, k)) for k in range(3)]
    out = {}
    for fmt, block, shuffle in CASES + [("npy", None, True), ("npy", None, False)]:
        if True:
            name = f"{fmt}-{block}-{shuffle}"
            kw = {} if block is None else dict(block_size=block)
            tokshuf.build_cache(
                files,
                root / name,
                seqlen=SEQLEN,
                chunk_size=CHUNK,
                shuffle=shuffle,
                format=fmt,
                progress=False,
                threads=2,
                **kw,
            )
            out[(fmt, block, shuffle)] = root / name
    return out


def members(cache: Path):
    """Every member of every shard, in order, as (name, bytes), with tarfile only."""
    for shard in sorted(glob.glob(str(cache / "shard_*.tar"))):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                f = tar.extractfile(m)
                assert f is not None
                yield m.name, f.read()


def contexts_by_hand(cache: Path) -> np.ndarray:
    """The contexts of a cache of any format, decoded with NumPy (and zstandard) only."""
    rows = []
    for name, data in members(cache):
        if name.endswith(".zst"):
            data = zstandard.ZstdDecompressor().decompress(data)
        a = np.load(io.BytesIO(data), allow_pickle=False)
        rows.extend(a.reshape(-1, SEQLEN))
    return np.stack(rows)


@pytest.mark.parametrize(("fmt", "block", "shuffle"), CASES)
def test_block_formats_hold_the_npy_contexts_in_order(built, fmt, block, shuffle):
    npy, blocked = built[("npy", None, shuffle)], built[(fmt, block, shuffle)]
    want = contexts_by_hand(npy)
    assert np.array_equal(contexts_by_hand(blocked), want)
    cache = tokshuf.Cache(blocked)
    assert (cache.format, cache.block_size) == (fmt, block or 64)
    assert cache.chunk_sizes == tokshuf.Cache(npy).chunk_sizes
    assert np.array_equal(cache[:], want)
    assert np.array_equal(cache.get_batch([5, 0, len(cache) - 1, 5], dtype="int64"), want[[5, 0, -1, 5]])
    single = np.concatenate(list(tokshuf.Reader(cache, batch_size=6, single_pass=True, dtype="uint16")))
    assert np.array_equal(single, want)
    # Epoch 0 of the endless order is the npy cache's too, for any number of threads: every
    # stream is still in its first chunk for the first R* x (smallest chunk) examples.
    for threads in (1, 3):
        a = tokshuf.Reader(cache, batch_size=4, threads=threads, prefetch=6)
        b = tokshuf.Reader(tokshuf.Cache(npy), batch_size=4)
        for _ in range(cache.ideal_readers * min(cache.chunk_sizes) // 4):
            assert np.array_equal(next(a), next(b))
    names = [n for n, _ in members(blocked)]
    assert all(n.endswith(".npy.zst" if fmt == "blocks.zst" else ".npy") for n in names)
    assert len(names) == sum(-(-n // (block or 64)) for n in cache.chunk_sizes)
    assert tokshuf.verify(blocked, full=True).ok


def test_blocks_take_about_two_bytes_per_id(built):
    """blocks of 64 at seqlen 2049 take 2.007 bytes per uint16 id (layout arithmetic, checked
    on a real shard here at this test's small sizes)."""

    def size(key):
        return sum(Path(p).stat().st_size for p in glob.glob(str(built[key] / "shard_*.tar")))

    cache = tokshuf.Cache(built[("blocks", None, False)])
    n, chunks = len(cache), cache.num_chunks
    # Per chunk of 10: one tar header, one 128-byte npy header, padding to 512, the trailer.
    assert size(("blocks", None, False)) <= n * SEQLEN * 2 + chunks * (512 + 128 + 511 + 1024)
    assert size(("blocks", None, False)) < 0.5 * size(("npy", None, False))
    assert size(("blocks.zst", None, False)) < size(("blocks", None, False))


@pytest.mark.filterwarnings(
    "ignore::ResourceWarning", "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
)  # stock webdataset leaves its shard files for the garbage collector to close
def test_stock_webdataset_yields_one_sample_per_block(built):
    wds = pytest.importorskip("webdataset")
    cache = built[("blocks", 4, True)]
    shards = sorted(glob.glob(str(cache / "shard_*.tar")))
    samples = list(wds.WebDataset(shards, shardshuffle=False).decode())
    assert [s["__key__"] for s in samples][:3] == ["00000000_00000000", "00000000_00000001", "00000000_00000002"]
    assert {s["npy"].shape for s in samples} == {(4, SEQLEN), (2, SEQLEN)}  # chunks of 10: 4 + 4 + 2
    assert np.array_equal(np.concatenate([s["npy"] for s in samples]), tokshuf.Cache(cache)[:])
    del samples
    gc.collect()  # webdataset's unclosed files are reported here, under this test's filter


@pytest.mark.parametrize("fmt", ["blocks", "blocks.zst"])
def test_order_of_later_epochs(tmp_path, fmt):
    """Every epoch against the reference: blocks.zst keeps each block's contexts together
    (format §6), blocks reads like npy."""
    sizes, cs, r_star, block = [6, 6, 6, 4, 6, 3], 6, 4, 4
    d = write_cache(tmp_path / "c", sizes, cs, fmt=fmt, block_size=block)
    cache = tokshuf.Cache(d)
    n = sum(sizes)
    want = reference_examples(sizes, cs, r_star, 5, True, 4 * n, block=block if fmt == "blocks.zst" else 1)
    r = tokshuf.Reader(cache, batch_size=4, ideal_readers=r_star, seed=5, threads=2)
    got = [a for _ in range(n) for a in addresses(next(r))]
    assert got == want
    plain = reference_examples(sizes, cs, r_star, 5, True, 4 * n)
    assert (got == plain) == (fmt == "blocks"), "only blocks.zst changes later epochs"


def test_blend_and_resume_across_formats(built):
    a, b = tokshuf.Cache(built[("npy", None, False)]), tokshuf.Cache(built[("blocks.zst", 4, True)])
    blend = tokshuf.Blend([(a, 0.5), (b, 0.5)], seed=3)
    r = tokshuf.Reader(blend, batch_size=8, world_size=2, rank=1)
    for _ in range(7):
        next(r)
    state = r.state_dict()
    want = [next(r) for _ in range(5)]
    again = tokshuf.Reader(blend, batch_size=8, world_size=2, rank=1)
    again.load_state_dict(state)
    assert all(np.array_equal(x, next(again)) for x in want)


def test_corrupt_block_is_an_error_naming_the_shard(tmp_path):
    d = write_cache(tmp_path / "c", [4, 4], 4, fmt="blocks.zst", block_size=3)
    shard = d / "shard_00000001.tar"
    data = bytearray(shard.read_bytes())
    data[512 + 20] ^= 0xFF
    shard.write_bytes(bytes(data))
    cache = tokshuf.Cache(d)
    assert addresses(cache[:4]) == [(0, i) for i in range(4)]
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000001\.tar"):
        cache[4]


def test_block_size_is_an_option_of_the_block_formats(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(5, 1))
    with pytest.raises(tokshuf.ConfigError, match="block_size"):
        tokshuf.build_cache([src], tmp_path / "o", format="npy", block_size=4, progress=False)
    with pytest.raises(tokshuf.ConfigError, match="block_size"):
        tokshuf.build_cache([src], tmp_path / "o", format="blocks", block_size=0, progress=False)
