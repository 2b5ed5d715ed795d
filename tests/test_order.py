"""The reader's global order equals a pure-Python reference of DESIGN §6 (reader_helpers.py).

Synthetic caches (any chunk sizes, several short chunks) hold the address (chunk, index) of each
context in its first two ids, so every batch row says where it came from.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tokshuf
from hypothesis import given, settings
from hypothesis import strategies as st
from support.reader import (
    Permutation,
    addresses,
    combine,
    mix64,
    reference_example_far,
    reference_examples,
    write_cache,
)


@st.composite
def layouts(draw):
    """(chunk sizes, chunk_size): mostly full chunks, some short ones anywhere."""
    cs = draw(st.integers(1, 6))
    n = draw(st.integers(1, 14))
    sizes = [cs if draw(st.integers(0, 3)) else draw(st.integers(1, cs)) for _ in range(n)]
    return sizes, cs


def divisors(b: int):
    return [r for r in range(1, 17) if b % r == 0]


def test_hash_reimplementation_matches_pinned_values():
    # Same golden value hash.rs pins: SplitMix64(0).next_u64() == mix64(GOLDEN).
    assert mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    p = Permutation(10, combine(1, 2))
    assert sorted(p.apply(i) for i in range(10)) == list(range(10))


@settings(max_examples=40)
@given(
    layout=layouts(),
    r_star=st.sampled_from([1, 3, 8, 64]),
    batch_size=st.sampled_from([1, 2, 4, 6, 8, 12, 16]),
    seed=st.integers(0, 2**64 - 1),
    reshuffle=st.booleans(),
    fmt=st.sampled_from(["npy", "json.gz"]),
)
def test_reader_equals_reference_for_every_world_size(layout, r_star, batch_size, seed, reshuffle, fmt):
    sizes, cs = layout
    total = sum(sizes)
    # Enough batches to cover several epochs, so reshuffled epochs are compared too.
    steps = max(2, math.ceil((3 * total + r_star * cs) / batch_size))
    want = reference_examples(sizes, cs, r_star, seed, reshuffle, steps * batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        cache = tokshuf.Cache(write_cache(Path(tmp) / "c", sizes, cs, fmt=fmt))
        for world in divisors(batch_size):
            per_rank = []
            for rank in range(world):
                r = tokshuf.Reader(
                    cache,
                    batch_size=batch_size,
                    rank=rank,
                    world_size=world,
                    ideal_readers=r_star,
                    seed=seed,
                    reshuffle=reshuffle,
                    prefetch=2 if rank % 2 else 0,
                )
                per_rank.append([addresses(next(r)) for _ in range(steps)])
                assert all(len(b) == batch_size // world for b in per_rank[-1])
            for b in range(steps):
                got = [None] * batch_size
                for rank in range(world):
                    for j, addr in enumerate(per_rank[rank][b]):
                        got[rank + j * world] = addr  # rank r holds examples b*B + r + j*R
                assert got == want[b * batch_size : (b + 1) * batch_size], (world, b)


@settings(max_examples=30)
@given(
    layout=layouts(),
    r_star=st.sampled_from([1, 3, 8, 64]),
    seed=st.integers(0, 2**32),
    reshuffle=st.booleans(),
    data=st.data(),
)
def test_far_examples_equal_periodic_reference(layout, r_star, seed, reshuffle, data):
    sizes, cs = layout
    with tempfile.TemporaryDirectory() as tmp:
        cache = tokshuf.Cache(write_cache(Path(tmp) / "c", sizes, cs))
        r = tokshuf.Reader(cache, batch_size=4, ideal_readers=r_star, seed=seed, reshuffle=reshuffle)
        for i in data.draw(st.lists(st.integers(0, 10**13), min_size=1, max_size=6)) + [10**9 * 4 + 3]:
            assert r.locate(i)[1:] == reference_example_far(sizes, cs, r_star, seed, reshuffle, i)
        # Seek to a far step yields the same rows as random access there.
        r.seek(step=10**9)
        np.testing.assert_array_equal(next(r), r.batch_at(10**9))


def test_near_examples_agree_between_references():
    sizes, cs = [4, 4, 2, 4, 3, 4, 1], 4
    want = reference_examples(sizes, cs, 3, 5, True, 200)
    assert [reference_example_far(sizes, cs, 3, 5, True, i) for i in range(200)] == want


def test_epochs_are_permutations_and_reshuffle_changes_order(tmp_path):
    sizes, cs = [5] * 9 + [2], 5
    cache = tokshuf.Cache(write_cache(tmp_path / "c", sizes, cs))
    total = sum(sizes)
    r = tokshuf.Reader(cache, batch_size=total, ideal_readers=1, seed=3)
    epochs = [addresses(next(r)) for _ in range(3)]
    for e in epochs:
        assert sorted(e) == sorted((c, i) for c, n in enumerate(sizes) for i in range(n))
    assert epochs[0] == [(c, i) for c, n in enumerate(sizes) for i in range(n)]  # epoch 0: manifest order
    assert epochs[1] != epochs[0] and epochs[2] != epochs[1]
    # The short chunk keeps its position in every epoch.
    for e in epochs:
        assert sorted(e[45:47]) == [(9, 0), (9, 1)]
    same = tokshuf.Reader(cache, batch_size=total, ideal_readers=1, seed=3, reshuffle=False)
    assert all(addresses(next(same)) == epochs[0] for _ in range(3))


def test_default_ideal_readers(tmp_path):
    assert tokshuf.Cache(write_cache(tmp_path / "a", [2] * 5, 2)).ideal_readers == 5
    assert tokshuf.Cache(write_cache(tmp_path / "b", [1] * 70, 1)).ideal_readers == 64
    c = tokshuf.Cache(write_cache(tmp_path / "c", [1] * 70, 1, extra={"ideal_readers": 7}))
    assert c.ideal_readers == 7
    assert tokshuf.Reader(c, batch_size=2).ideal_readers == 7


@pytest.mark.parametrize("single_pass", [False, True])
def test_far_seek_is_repeatable(tmp_path, single_pass):
    sizes = [8] * 500 + [3] + [8] * 499 + [5]
    cache = tokshuf.Cache(write_cache(tmp_path / "c", sizes, 8))
    r = tokshuf.Reader(cache, batch_size=64, single_pass=single_pass, ideal_readers=64)
    far = 10**12 if not single_pass else (sum(sizes) - 1) // 64
    r.seek(step=far)
    a = next(r)
    r.seek(step=far)
    np.testing.assert_array_equal(a, next(r))


def test_locate_cost_does_not_grow_with_the_step(tmp_path):
    # A ratio, not a time: locating an example at step 10^9 costs what it costs at step 1
    # (no per-epoch or per-example structure is built or walked).
    import time

    sizes = [8] * 300
    for k in range(0, 300, 6):
        sizes[k] = 1 + k % 7  # 50 short chunks spread over the cache
    r = tokshuf.Reader(write_cache(tmp_path / "c", sizes, 8), batch_size=64, ideal_readers=64)

    def cost(step):
        best = float("inf")
        for _ in range(7):
            t0 = time.perf_counter()
            for j in range(300):
                r.locate(step * 64 + j)
            best = min(best, time.perf_counter() - t0)
        return best

    cost(1)
    assert cost(10**9) < 10 * cost(1)
