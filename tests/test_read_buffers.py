"""The reader reuses the buffers of batches the caller is done with: batches (and views of
them) the caller keeps, or writes into, must be exactly what was read, whatever happens to the
others (checked against the tars and the pure-Python order)."""

from __future__ import annotations

import numpy as np
import pytest
import tokshuf
from support.cache import read_chunks
from support.corpus import make_docs, write_jsonl
from support.reader import reference_examples

SEQLEN, CHUNK, BATCH = 24, 7, 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    base = tmp_path_factory.mktemp("buffers")
    files = [write_jsonl(base / "in" / f"{k}.jsonl", make_docs(30 + 9 * k, k)) for k in range(3)]
    tokshuf.build_cache(files, base / "c", seqlen=SEQLEN, chunk_size=CHUNK, progress=False, threads=1)
    return base / "c"


@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64"])
@pytest.mark.parametrize("prefetch", [0, 3])
def test_batches_kept_viewed_or_written_by_the_caller_stay_as_read(cache, dtype, prefetch):
    chunks = read_chunks(cache)
    reader = tokshuf.Reader(cache, batch_size=BATCH, seed=3, dtype=dtype, prefetch=prefetch, threads=2)
    steps = 60  # several epochs: later ones reshuffle
    locs = reference_examples([len(c) for c in chunks], CHUNK, reader.ideal_readers, 3, True, steps * BATCH)
    want = np.array([chunks[c][i] for c, i in locs], dtype=np.int64).reshape(steps, BATCH, SEQLEN)
    kept = []
    for step, batch in zip(range(steps), reader):
        assert batch.dtype == np.dtype(dtype) and batch.flags.writeable
        if step % 3 == 0:
            kept.append((step, slice(None), batch))
        elif step % 3 == 1:
            kept.append((step, slice(1, None), batch[1:]))  # only a view outlives the batch
        else:
            assert np.array_equal(batch, want[step])
            batch[:] = 7  # the caller's own data from now on; its buffer must be filled anew
        del batch
    for step, rows, got in kept:
        assert np.array_equal(got, want[step][rows]), step
