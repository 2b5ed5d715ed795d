"""Follow mode: a reader started while its cache is being built yields exactly the batches of
the finished cache; a dead build is a typed error, not a hang; two builds into one folder are
refused.

Builds run in subprocesses with the core's test hooks (rust/tokshuf-core/src/testhook.rs):
``TOKSHUF_TEST_GATE`` holds the build at a named point until the test has opened its reader
(so the reader provably starts before stage 2 / while streaming), ``TOKSHUF_TEST_SLOW`` makes
every shard slow to appear so the reader has to wait for them, ``TOKSHUF_TEST_PAUSE`` stops the
build for good so the test can kill it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import List

import numpy as np
import pytest
import tokshuf
from support.build import BuildProcess
from support.corpus import parts

OPTS = dict(seqlen=32, chunk_size=8, threads=2, progress=False)


@pytest.fixture
def corpus(tmp_path: Path) -> List[Path]:
    """Four files, about 190 chunks of 8 contexts."""
    return parts(tmp_path, 4, docs=40, step=15, seed=7, name="p")


def gated_build(inputs, out: Path, opts: dict, slow: str = "stage2.shard:6"):
    """A build held at point "start" (tokshuf.json exists, nothing tokenized) until `release()`."""
    gate = out.parent / (out.name + ".gate")
    b = BuildProcess(inputs, out, opts, {"TOKSHUF_TEST_GATE": f"start:{gate}", "TOKSHUF_TEST_SLOW": slow})
    b.wait_trace("gate start")
    return b, (lambda: gate.write_text("go"))


def in_thread(fn):
    """Run fn on a thread; returns a callable that joins it and returns fn's result or raises."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def join(timeout: float = 120):
        t.join(timeout)
        assert not t.is_alive(), "reader thread hung"
        if "error" in box:
            raise box["error"]
        return box["value"]

    return join


def take(reader, n: int) -> List[np.ndarray]:
    return [next(reader) for _ in range(n)] if n else list(reader)


def assert_same(got: List[np.ndarray], want: List[np.ndarray]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and np.array_equal(g, w), f"batch {k} differs"


@pytest.mark.parametrize("fmt", ["npy", "blocks.zst"])
def test_follow_shuffled_build_from_stage_one(corpus, tmp_path, fmt):
    out = tmp_path / "c"
    b, release = gated_build(corpus, out, dict(OPTS, format=fmt))

    def follow(rank: int, prefetch: int):
        # Opened while stage 1 has not even started: waits for the plan, then for each shard.
        r = tokshuf.Reader(out, follow=True, timeout=60, batch_size=16, rank=rank, world_size=2, prefetch=prefetch)
        assert r.cache.following and r.cache.metadata["status"] == "building"
        return take(r, 3 * len(r.cache) // 16 + 2)

    joins = [in_thread(lambda: follow(0, 0)), in_thread(lambda: follow(1, 3))]
    time.sleep(0.1)  # let the readers start waiting (they would pass the test without waiting too)
    release()
    got = [j() for j in joins]
    b.finish()
    for rank, batches in enumerate(got):
        want = take(tokshuf.Reader(out, batch_size=16, rank=rank, world_size=2), len(batches))
        assert_same(batches, want)


def test_follow_streaming_build(corpus, tmp_path):
    out = tmp_path / "c"
    opts = dict(OPTS, shuffle=False)
    # Slow files keep the build "streaming" while shards appear, so readers serve from the
    # manifest prefix before the plan is final.
    b, release = gated_build(corpus, out, opts, slow="stage2.shard:8,stage1.file:300")
    cache = tokshuf.Cache(out, follow=True, timeout=60)
    assert cache.following and cache.metadata["status"] == "streaming"
    # Endless readers with an explicit R* (served from the manifest prefix while streaming),
    # with the default R* (min(64, N): known once 64 chunks are), and single passes. Readers
    # without an explicit R* wait for it at construction, so all are made on their threads.
    makers = {
        "r4": lambda: tokshuf.Reader(cache, batch_size=12, ideal_readers=4, seed=5, prefetch=2),
        "default": lambda: tokshuf.Reader(out, follow=True, timeout=60, batch_size=16, prefetch=0),
        "single": lambda: tokshuf.Reader(
            out, follow=True, timeout=60, batch_size=10, single_pass=True, ideal_readers=3, prefetch=2
        ),
        "single_drop": lambda: tokshuf.Reader(
            out,
            follow=True,
            timeout=60,
            batch_size=7,
            single_pass=True,
            drop_last=True,
            prefetch=0,
            rank=1,
            world_size=7,
        ),
    }
    counts = {"r4": 400, "default": 300, "single": 0, "single_drop": 0}
    states = {}

    def read(name):
        r = makers[name]()
        if name == "single":
            assert r.num_examples is None  # not known while streaming
        first = take(r, 3)
        states[name] = r.state_dict()
        return first + take(r, max(counts[name] - 3, 0))

    joins = {name: in_thread(lambda name=name: read(name)) for name in makers}
    release()
    got = {name: j() for name, j in joins.items()}
    b.finish()
    full = tokshuf.Cache(out)
    want = {
        "r4": take(tokshuf.Reader(full, batch_size=12, ideal_readers=4, seed=5), 400),
        "default": take(tokshuf.Reader(full, batch_size=16), 300),
        "single": take(tokshuf.Reader(full, batch_size=10, single_pass=True, ideal_readers=3), 0),
        "single_drop": take(
            tokshuf.Reader(full, batch_size=7, single_pass=True, drop_last=True, rank=1, world_size=7), 0
        ),
    }
    for name in makers:
        assert_same(got[name], want[name])
    assert len(want["single"]) == -(-len(full) // 10)
    # A state saved while following loads on the finished cache.
    for name, kw in (
        ("r4", dict(batch_size=12, ideal_readers=4, seed=5)),
        ("single", dict(batch_size=10, single_pass=True, ideal_readers=3)),
    ):
        r = tokshuf.Reader(full, **kw)
        r.load_state_dict(states[name])
        assert np.array_equal(next(r), want[name][3])
    assert not (out / ".tokshuf-lock").exists()


def test_follow_cache_reads_by_index(corpus, tmp_path):
    out = tmp_path / "c"
    b, release = gated_build(corpus, out, dict(OPTS, shuffle=False))
    cache = tokshuf.Cache(out, follow=True, timeout=60)
    join = in_thread(lambda: (len(cache), cache.get_batch([0, 5, 100, -1])))
    release()
    n, rows = join()
    b.finish()
    full = tokshuf.Cache(out)
    assert n == len(full)
    assert np.array_equal(rows, full.get_batch([0, 5, 100, -1]))


def test_dead_build_is_a_typed_error(corpus, tmp_path):
    out = tmp_path / "c"
    # Stops for good after its third shard: alive, but nothing more will come.
    b = BuildProcess(corpus, out, OPTS, {"TOKSHUF_TEST_PAUSE": "stage2.shard:3"})
    b.wait_trace("paused stage2.shard")
    r = tokshuf.Reader(out, follow=True, timeout=0.3, batch_size=64, prefetch=0)
    with pytest.raises(tokshuf.FollowTimeoutError) as e:
        take(r, 100)
    assert isinstance(e.value, TimeoutError) and "build is running" in str(e.value)
    # Killed while a reader waits: the reader notices the lock is gone and fails at once,
    # long before its timeout.
    waiting = tokshuf.Reader(out, follow=True, timeout=600, batch_size=64, prefetch=2)
    join = in_thread(lambda: take(waiting, 100))
    time.sleep(0.2)
    b.kill()
    with pytest.raises(tokshuf.BuildNotRunningError, match="resume it"):
        join(timeout=30)
    # A reader opened after the build died fails the same way, at once.
    with pytest.raises(tokshuf.BuildNotRunningError):
        take(tokshuf.Reader(out, follow=True, timeout=600, batch_size=64), 100)
    # The resumed build completes; a follow reader of a complete cache is a plain reader.
    tokshuf.build_cache([str(p) for p in corpus], out, **OPTS)
    assert not tokshuf.Cache(out, follow=True).following


def test_no_build_at_all(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(tokshuf.BuildNotRunningError, match=r"no build has written tokshuf\.json there yet"):
        tokshuf.Cache(tmp_path / "empty", follow=True)
    # With a timeout, a build that has not started may be about to: it is waited for.
    t0 = time.monotonic()
    with pytest.raises(tokshuf.FollowTimeoutError):
        tokshuf.Cache(tmp_path / "missing", follow=True, timeout=0.3)
    assert time.monotonic() - t0 >= 0.3


def test_a_reader_started_before_its_build_waits_for_it(corpus, tmp_path):
    """A trainer and its build launched together: the reader may look first."""
    out = tmp_path / "c"
    join = in_thread(lambda: take(tokshuf.Reader(out, follow=True, timeout=60, batch_size=16, prefetch=2), 40))
    time.sleep(0.2)
    tokshuf.build_cache([str(p) for p in corpus], out, **OPTS)
    assert_same(join(), take(tokshuf.Reader(out, batch_size=16), 40))


def test_a_rebuild_with_other_options_is_not_mixed_in(corpus, tmp_path):
    """A follow reader whose build is killed and the folder rebuilt with overwrite=True and
    another seed (same chunk plan, other contexts in each shard) must not go on reading the
    new build's shards as if they were the old one's."""
    out = tmp_path / "c"
    b = BuildProcess(corpus, out, OPTS, {"TOKSHUF_TEST_PAUSE": "stage2.shard:6"})
    b.wait_trace("paused stage2.shard")
    # One stream and one chunk a batch: batch 0 is chunk 0, which the build writes whatever its
    # threads do (the paused one holds no chunk; with 64 streams batch 0 could need one it held).
    r = tokshuf.Reader(out, follow=True, timeout=60, batch_size=8, ideal_readers=1, prefetch=0)
    take(r, 1)
    b.kill()
    tokshuf.build_cache([str(p) for p in corpus], out, **dict(OPTS, seed=1), overwrite=True)
    with pytest.raises(tokshuf.CacheCorruptError, match="changed while following the build"):
        take(r, len(tokshuf.Cache(out)) // 8)


def test_following_is_decided_when_a_cache_is_opened(corpus, tmp_path):
    out = tmp_path / "c"
    b, release = gated_build(corpus, out, OPTS)
    try:
        release()
        following = tokshuf.Cache(out, follow=True, timeout=60)
        assert following.following
        # Options that disagree with the opened cache are refused, not dropped.
        with pytest.raises(tokshuf.ConfigError, match="was opened with follow=True, timeout=60"):
            tokshuf.Reader(following, batch_size=16, timeout=5)
        tokshuf.Reader(following, batch_size=16, follow=True, timeout=60)  # the same: fine
        # Blends read finished caches only.
        with pytest.raises(tokshuf.ConfigError, match="blends read finished caches"):
            tokshuf.Blend([(following, 1), (following.path, 1)])
        r = tokshuf.Reader(following, batch_size=16)
        take(r, 3)
    finally:
        b.finish()
    with pytest.raises(tokshuf.ConfigError, match="was opened with follow=False"):
        tokshuf.Reader(tokshuf.Cache(out), batch_size=16, follow=True)
    # Once the followed build is complete, states of the finished cache's readers load too.
    plain = tokshuf.Reader(out, batch_size=16)
    take(plain, 5)
    r.load_state_dict(plain.state_dict())
    assert_same(take(r, 3), take(plain, 3))


def test_second_concurrent_build_is_refused(corpus, tmp_path):
    out = tmp_path / "c"
    b = BuildProcess(corpus, out, OPTS, {"TOKSHUF_TEST_PAUSE": "stage1.file"})
    try:
        b.wait_trace("paused stage1.file")
        with pytest.raises(tokshuf.OutputExistsError, match="another tokshuf build"):
            tokshuf.build_cache([str(p) for p in corpus], out, **OPTS)
        with pytest.raises(tokshuf.OutputExistsError, match="another tokshuf build"):
            tokshuf.build_cache([str(p) for p in corpus], out, **OPTS, overwrite=True)
    finally:
        b.kill()
    # The kernel dropped the dead build's lock: the same build resumes, and leaves no lock file.
    tokshuf.build_cache([str(p) for p in corpus], out, **OPTS)
    assert not (out / ".tokshuf-lock").exists()
    assert len(tokshuf.Cache(out)) > 0


def test_refused_build_leaves_no_lock_file(tmp_path, corpus):
    out = tmp_path / "c"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(tokshuf.OutputExistsError):
        tokshuf.build_cache([str(p) for p in corpus], out, **OPTS)
    assert sorted(os.listdir(out)) == ["notes.txt"]
