"""tokshuf.torch: a DataLoader over ReaderDataset yields exactly the plain Reader's sequence for
0, 1 and 3 workers (skipped where PyTorch is not installed)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

import tokshuf  # noqa: E402
from support.reader import write_cache  # noqa: E402
from tokshuf.torch import ReaderDataset  # noqa: E402


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return write_cache(tmp_path_factory.mktemp("torch") / "c", [4] * 9 + [3] + [4] * 5 + [2], 4)


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("steps", [None, 10])
def test_dataloader_equals_plain_reader(cache_dir, workers, steps):
    kw = dict(batch_size=6, rank=1, world_size=2, seed=5, ideal_readers=3)
    ref = tokshuf.Reader(cache_dir, **kw)
    want = [next(ref) for _ in range(25)]
    ds = ReaderDataset(tokshuf.Reader(cache_dir, **kw), steps=steps)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    got = []
    for t in loader:
        got.append(t.numpy())
        if len(got) == 25:
            break
    assert len(got) == (25 if steps is None else steps)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers", [0, 3])
def test_single_pass_through_workers_and_resume(cache_dir, workers):
    kw = dict(batch_size=4, single_pass=True)
    want = list(tokshuf.Reader(cache_dir, **kw))
    ds = ReaderDataset(tokshuf.Reader(cache_dir, **kw))
    got = [t.numpy() for t in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    state = ds.state_dict(batches_seen=5)
    ds2 = ReaderDataset(tokshuf.Reader(cache_dir, **kw))
    ds2.load_state_dict(state)
    rest = [t.numpy() for t in torch.utils.data.DataLoader(ds2, batch_size=None, num_workers=workers)]
    assert len(rest) == len(want) - 5
    for a, b in zip(rest, want[5:]):
        np.testing.assert_array_equal(a, b)


def test_shifted_pairs(cache_dir):
    ds = ReaderDataset(tokshuf.Reader(cache_dir, batch_size=2, dtype="int64"), steps=3, shift=True)
    for x, y in ds:
        assert x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    # With boundaries, they are the inputs' (the same shape, and what boundaries_of gives them).
    r = tokshuf.Reader(cache_dir, batch_size=2, boundaries="position_ids")
    want = [next(tokshuf.Reader(cache_dir, batch_size=2, boundaries="position_ids"))[0]]
    (x, y), pos = next(iter(ReaderDataset(r, steps=1, shift=True)))
    assert pos.shape == x.shape
    assert np.array_equal(pos.numpy(), r.boundaries_of(want[0][:, :-1]))
