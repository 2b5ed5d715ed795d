"""tokshuf.grain: record i of a DataSource is example[i] of the reader's order (checked against the
pure-Python reference of format §6), and Grain's own slicing and batching give exactly the
batches of tokshuf.Reader for every world size, across epochs, blends, single passes and a
checkpoint of Grain's iterator. The Grain parts are skipped where grain is not installed."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import tokshuf
from support.blend import write_blend_caches
from support.reader import reference_examples, write_cache
from tokshuf.grain import DataSource, map_dataset

SIZES = [4] * 9 + [3] + [4] * 5 + [2]  # two short chunks: the order's hardest case
CHUNK = 4


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return write_cache(tmp_path_factory.mktemp("grain") / "c", SIZES, CHUNK)


@pytest.mark.parametrize("reshuffle", [True, False])
def test_records_are_the_reference_order_across_epochs(cache_dir, reshuffle):
    n = sum(SIZES)
    src = DataSource(cache_dir, num_records=3 * n + 5, seed=7, ideal_readers=3, reshuffle=reshuffle)
    assert len(src) == 3 * n + 5
    want = reference_examples(SIZES, CHUNK, 3, 7, reshuffle, len(src))
    got = [tuple(src[i][:2]) for i in range(len(src))]
    assert got == want
    assert src[0].dtype == np.int32 and src[0].shape == (8,)


def test_default_length_is_one_epoch_and_bounds_are_checked(cache_dir):
    src = DataSource(cache_dir)
    assert len(src) == sum(SIZES)
    with pytest.raises(IndexError):
        src[len(src)]
    with pytest.raises(tokshuf.ConfigError):
        DataSource(cache_dir, num_records=-1)
    with pytest.raises(tokshuf.ConfigError):
        DataSource(cache_dir, single_pass=True, num_records=3)


def test_single_pass_is_manifest_order(cache_dir):
    src = DataSource(cache_dir, single_pass=True, dtype="int64")
    cache = tokshuf.Cache(cache_dir)
    assert len(src) == len(cache)
    np.testing.assert_array_equal(np.stack([src[i] for i in range(len(src))]), cache[:].astype(np.int64))


def test_pickles_and_repr_names_the_order(cache_dir):
    src = DataSource(cache_dir, num_records=50, seed=3)
    back = pickle.loads(pickle.dumps(src))
    assert repr(back) == repr(src)
    np.testing.assert_array_equal(back[41], src[41])
    assert repr(DataSource(cache_dir, num_records=50, seed=4)) != repr(src)
    assert src._getitems([5, 1])[0].tolist() == src[5].tolist()


# ---- through Grain ---------------------------------------------------------------------------
@pytest.fixture
def grain():
    return pytest.importorskip("grain", reason="grain is not installed (pip install grain)")


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_grain_batches_equal_the_reader_for_every_world_size(grain, cache_dir, world_size):
    B, steps = 8, 20  # 160 examples: beyond the first epoch (58)
    for rank in range(world_size):
        ds = map_dataset(cache_dir, batch_size=B, rank=rank, world_size=world_size, num_records=B * steps, seed=2)
        reader = tokshuf.Reader(cache_dir, batch_size=B, rank=rank, world_size=world_size, seed=2)
        got = list(ds)
        assert len(got) == steps
        for b, batch in enumerate(got):
            np.testing.assert_array_equal(batch, next(reader), err_msg=f"rank {rank}, batch {b}")


def test_grain_single_pass_with_a_short_last_batch(grain, cache_dir):
    for rank in range(2):
        got = list(map_dataset(cache_dir, batch_size=8, rank=rank, world_size=2, single_pass=True))
        want = list(tokshuf.Reader(cache_dir, batch_size=8, rank=rank, world_size=2, single_pass=True))
        assert [g.shape for g in got] == [w.shape for w in want]
        assert got[-1].shape[0] < 4  # 58 examples: the last global batch is short
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_grain_over_a_blend(grain, tmp_path):
    paths = write_blend_caches(tmp_path, [([4, 4, 3], 4), ([4, 4, 4, 4, 1], 4)])
    blend = tokshuf.Blend([(paths[0], 1), (paths[1], 3)], seed=9, quantum=16)
    ds = map_dataset(blend, batch_size=4, rank=1, world_size=2, num_records=4 * 30)
    reader = tokshuf.Reader(blend, batch_size=4, rank=1, world_size=2)
    for batch in ds:
        np.testing.assert_array_equal(batch, next(reader))
    assert len(DataSource(blend)) == blend.single_pass_length()


def test_grain_iterator_checkpoint_resumes_the_same_batches(grain, cache_dir):
    ds = map_dataset(cache_dir, batch_size=4, rank=0, world_size=2, num_records=4 * 40, seed=1)
    it = iter(ds.to_iter_dataset())
    for _ in range(13):
        next(it)
    state = it.get_state()
    want = [next(it) for _ in range(10)]
    again = iter(
        map_dataset(cache_dir, batch_size=4, rank=0, world_size=2, num_records=4 * 40, seed=1).to_iter_dataset()
    )
    again.set_state(state)
    for w in want:
        np.testing.assert_array_equal(next(again), w)
    reader = tokshuf.Reader(cache_dir, batch_size=4, rank=0, world_size=2, seed=1, start_step=13)
    np.testing.assert_array_equal(want[0], next(reader))


def test_map_dataset_checks_its_arguments(grain, cache_dir):
    with pytest.raises(tokshuf.ConfigError, match="divisible"):
        map_dataset(cache_dir, batch_size=6, rank=0, world_size=4)
    with pytest.raises(tokshuf.ConfigError, match="rank"):
        map_dataset(cache_dir, batch_size=8, rank=2, world_size=2)
    with pytest.raises(tokshuf.ConfigError, match="DataSource"):
        map_dataset(DataSource(cache_dir), batch_size=8, seed=3)
