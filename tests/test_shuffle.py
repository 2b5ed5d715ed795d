"""The shuffle (DESIGN §5): the build's order equals a pure-Python reference (tests/model.py),
hash.rs values are pinned, and the permutation is uniform."""

from __future__ import annotations

import functools
import hashlib
import math
import tempfile
from collections import Counter
from itertools import permutations
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import cache, model, tokref
from support.build import build as run_build
from support.corpus import make_docs, write_jsonl

SPEC = "tiktoken:r50k_base"
EOT = 50256


@pytest.fixture(scope="module")
def encode():
    return tokref.tiktoken_reference("r50k_base").encode_ordinary


build = functools.partial(run_build, tokenizer=SPEC)


# --------------------------------------------------------------------------------------
# Pinned values: the same constants are asserted in hash.rs's Rust unit test, so the two
# implementations and these numbers all agree; a change to any of them is a format change.


def test_golden_hash_values():
    assert model.mix64(0) == 0
    assert model.mix64(1) == 0x5692161D100B05E5
    assert model.mix64(0xDEADBEEF) == 0x4E062702EC929EEA
    assert model.combine(0, 0) == 0x519665BF91416C4D
    assert model.cell_hash(0, 0, 0) == 0x44D6B7E32390BBB0
    assert model.cell_hash(42, 3, 1000) == 0xF7B9EA67C1B1E9A1
    assert model.cell_hash(2**64 - 1, 2**24 - 1, 2**40 - 1) == 0xAF0E2ADF84078823
    assert model.SplitMix64(0).next_u64() == 0xE220A8397B1DCDAF  # SplitMix64's published first output
    r = model.SplitMix64(1)
    assert [r.below(10) for _ in range(8)] == [5, 7, 9, 4, 4, 7, 8, 5]
    r = model.SplitMix64(3)
    assert [r.below(2**63 + 1) for _ in range(6)] == [
        1046394712501569526,
        672077022357742823,
        8196980753821780235,
        8195237237126968761,
        6441936413023419750,
        3099058506491908065,
    ]
    assert model.fisher_yates(list(range(10)), model.cell_rng(0, 0)) == [1, 9, 5, 4, 3, 6, 7, 8, 2, 0]
    assert model.fisher_yates(list(range(10)), model.cell_rng(7, 3)) == [0, 6, 3, 9, 5, 4, 8, 2, 1, 7]
    assert model.shuffled_ids([5, 3, 4], seed=9, cells=3) == [
        (0, 3),
        (2, 1),
        (0, 2),
        (0, 4),
        (1, 1),
        (2, 0),
        (0, 1),
        (1, 2),
        (0, 0),
        (2, 2),
        (1, 0),
        (2, 3),
    ]


# Changes whenever any output byte of a build changes: update it only for an intended format change.
GOLDEN_MANIFEST_SHA256 = "4787a863b0d284ae2b98659967f2d368cdefe9812ad019e2a84cb311fde825cb"


def test_golden_cache(tmp_path):
    """A whole small cache pinned by the hash of its manifest (which holds every shard's
    sha256): tokenizer, windowing, shuffle and tar layout together."""
    inputs = [write_jsonl(tmp_path / "in" / f"{i}.jsonl", make_docs(12, 100 + i)) for i in range(3)]
    build(inputs, tmp_path / "c", seqlen=16, chunk_size=10, num_local_cells=4, seed=2024)
    digest = hashlib.sha256((tmp_path / "c" / "manifest.jsonl").read_bytes()).hexdigest()
    assert digest == GOLDEN_MANIFEST_SHA256


# --------------------------------------------------------------------------------------
# The real build's order equals the reference.

WORDS = st.sampled_from(["alpha", " beta", " gamma", " delta", ".", "\n", " 7", " épsilon", " zeta", " eta"])
DOC = st.lists(WORDS, max_size=12).map("".join)


@given(
    files=st.lists(st.lists(DOC, max_size=8), min_size=1, max_size=4),
    seqlen=st.integers(1, 6),
    chunk_size=st.integers(1, 5),
    cells=st.sampled_from([None, 1, 2, 3, 7]),
    seed=st.integers(0, 2**64 - 1),
    tail=st.sampled_from(["stitch", "pad", "drop"]),
    memory_limit=st.sampled_from([None, 1]),
)
def test_build_order_equals_reference(encode, files, seqlen, chunk_size, cells, seed, tail, memory_limit):
    streams, _ = model.model_streams(files, encode, seqlen, tail, None, EOT, EOT)
    with tempfile.TemporaryDirectory() as tmp:
        paths = [write_jsonl(Path(tmp) / "in" / f"f{i}.jsonl", d) for i, d in enumerate(files)]
        result = build(
            paths,
            Path(tmp) / "c",
            seqlen=seqlen,
            chunk_size=chunk_size,
            num_local_cells=cells,
            seed=seed,
            tail=tail,
            memory_limit=memory_limit,
        )
        got = [[c.tolist() for c in ch] for ch in cache.read_chunks(Path(tmp) / "c")]
    used_cells = result.metadata["num_local_cells"]
    assert used_cells == (cells or 1)  # default: one cell per 65,536 contexts
    assert got == model.model_shuffle(streams, seed, used_cells, chunk_size)


def test_build_order_over_many_seeds(tmp_path, encode):
    """Distinct contexts, so the comparison sees every position; a few dozen real builds."""
    docs = [make_docs(15, 30 + i) for i in range(3)]
    inputs = [write_jsonl(tmp_path / "in" / f"{i}.jsonl", d) for i, d in enumerate(docs)]
    streams, _ = model.model_streams(docs, encode, 8, "stitch", None, EOT, EOT)
    contexts = [tuple(c) for s in streams for c in s]
    assert len(set(contexts)) == len(contexts) > 300
    for seed in range(12):
        out = tmp_path / f"s{seed}"
        build(inputs, out, seqlen=8, chunk_size=32, num_local_cells=5, seed=seed * 7919)
        got = [[c.tolist() for c in ch] for ch in cache.read_chunks(out)]
        assert got == model.model_shuffle(streams, seed * 7919, 5, 32), seed


# --------------------------------------------------------------------------------------
# Uniformity. The reference equals the build (above), so its statistics are the build's.


def chi2_critical(df: int, z: float = 4.75) -> float:
    """Wilson-Hilferty upper quantile of chi-square; z=4.75 is a tail of about 1e-6."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(observed, expected: float) -> float:
    return sum((o - expected) ** 2 / expected for o in observed)


def test_whole_permutation_is_uniform():
    """4 contexts in 2 cells: all 24 orders equally likely over 4,800 seeds."""
    seeds = 4800
    counts = Counter(tuple(model.shuffled_ids([3, 1], seed, cells=2)) for seed in range(seeds))
    assert len(counts) == 24
    assert chi2([counts[p] for p in permutations([(0, 0), (0, 1), (0, 2), (1, 0)])], seeds / 24) < chi2_critical(23)


def test_every_context_reaches_every_position():
    """10 contexts from 3 files in 4 cells: context x position counts over 5,000 seeds."""
    seeds, n = 5000, 10
    table = Counter()
    for seed in range(seeds):
        for position, ident in enumerate(model.shuffled_ids([4, 5, 1], seed, cells=4)):
            table[ident, position] += 1
    ids = [(0, p) for p in range(4)] + [(1, p) for p in range(5)] + [(2, 0)]
    stat = chi2([table[i, p] for i in ids for p in range(n)], seeds / n)
    assert stat < chi2_critical((n - 1) ** 2)


def test_cell_choice_is_uniform():
    cells = 7
    counts = Counter(model.cell_hash(12345, f, p) % cells for f in range(3) for p in range(7000))
    assert chi2(counts.values(), 21000 / cells) < chi2_critical(cells - 1)


def test_uniformity_check_can_fail():
    """A classic bug (Sattolo's cycle instead of Fisher-Yates) is caught by the same test."""

    def sattolo(items, rng):
        for i in range(len(items) - 1, 0, -1):
            j = rng.below(i)
            items[i], items[j] = items[j], items[i]
        return items

    counts = Counter(tuple(sattolo(list(range(4)), model.cell_rng(seed, 0))) for seed in range(4800))
    assert chi2([counts[p] for p in permutations(range(4))], 200) > chi2_critical(23)
