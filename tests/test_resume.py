"""Crash safety: a build killed with SIGKILL at any moment resumes to a byte-identical cache.

The harness runs real builds in subprocesses. Most kills land on named points of the build
(the core's test-only hook ``TOKSHUF_TEST_PAUSE`` makes it stop there, so the kill is not left
to timing); the rest land after a seeded random delay, anywhere at all.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import List

import pytest
import tokshuf
from support.build import run_and_kill_after, run_to_pause, start_build
from support.cache import assert_same_cache
from support.corpus import make_docs, write_jsonl

pytestmark = pytest.mark.slow

OPTS = dict(seqlen=32, chunk_size=64, threads=2, progress=False)


def make_corpus(root: Path, n_files: int = 6) -> List[Path]:
    """Several files of different sizes and compressions (about 1 MB in all)."""
    suffixes = [".jsonl", ".jsonl.gz", ".jsonl.zst"]
    return [
        write_jsonl(root / f"part{i:02d}{suffixes[i % 3]}", make_docs(250 + 80 * i, 100 + i)) for i in range(n_files)
    ]


# Named points (see the core's `testhook` calls), per phase, in build order. `NAME:N` = the N-th
# time NAME is reached in that run; `PREFIX*` = any point starting so.
STAGE1 = [
    "atomic_partial:tokshuf.json[building]",
    "start",
    "stage1.spill",
    "stage1.file",
    "atomic_partial:f0*",
    "atomic:f0*",
    "stage1.spill:2",
]
BETWEEN = ["stage1.stitched", "atomic_partial:tokshuf.json[writing]", "atomic:tokshuf.json[writing]", "plan"]
STAGE2 = ["stage2.tmp", "stage2.shard:5", "stage2.tmp:20", "stage2.shard:30", "stage2.shard:40"]
FINAL = [
    "atomic_partial:manifest.jsonl",
    "atomic:manifest.jsonl",
    "atomic_partial:tokshuf.json[complete]",
    "atomic:tokshuf.json[complete]",
]
# After either of these the cache is complete: only one of them can be hit.
DONE = ["complete", "cleanup"]
# shuffle=False streams: shards are written while files are tokenized, by other threads, so
# whether a run's N-th shard comes before or after its last file (and the stitch and plan after
# it) is timing: the shard points are killed at in a test of their own
# (test_a_streaming_build_killed_while_it_writes_shards_resumes_identically), and this walk
# takes the points of the thread that tokenizes, which come in this order.
STREAM_STAGE1 = [
    "atomic_partial:tokshuf.json[streaming]",
    "start",
    "stage1.spill",
    "stage1.file",
    "atomic_partial:f0*",
    "stage1.spill:2",
]
STREAM_SHARDS = ["stage2.tmp", "stage2.shard:2", "stage2.tmp:3"]

PHASES = {
    True: [
        ("stage1", STAGE1, 3),
        ("between", BETWEEN, 2),
        ("stage2", STAGE2, 3),
        ("final", FINAL, 2),
        ("done", DONE, 1),
    ],
    False: [("stage1", STREAM_STAGE1, 5), ("between", BETWEEN, 2), ("final", FINAL, 2), ("done", DONE, 1)],
}


# More seeds for a longer local hunt: TOKSHUF_KILL_SEEDS=20 python -m pytest tests/test_resume.py
SEEDS = list(range(int(os.environ.get("TOKSHUF_KILL_SEEDS", "1"))))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "streaming"])
def test_killed_at_named_points_resumes_identically(tmp_path, shuffle, seed):
    rng = random.Random(1234 + 10 * seed + shuffle)
    inputs = make_corpus(tmp_path / "in")
    opts = dict(OPTS, shuffle=shuffle)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **opts)

    got = tmp_path / "resumed"
    trace = tmp_path / "trace.txt"
    # Each run resumes the last one's state and is killed further on: a few points per phase,
    # chosen by the seeded rng, always in build order.
    hit = []
    for phase, points, k in PHASES[shuffle]:
        for point in sorted(rng.sample(points, k), key=points.index):
            if run_to_pause(inputs, got, opts, point, trace) is not None:
                hit.append((phase, point))
            else:
                hit.append(("missed", point))
    # One point may be missed: an earlier run may have done the work it marks.
    assert len([h for h in hit if h[0] != "missed"]) >= sum(k for _, _, k in PHASES[shuffle]) - 1, hit
    assert {phase for phase, _ in hit} == {phase for phase, _, _ in PHASES[shuffle]}, hit  # all hit
    tokshuf.build_cache(inputs, got, **opts)
    assert_same_cache(got, want)


@pytest.mark.parametrize("point", STREAM_SHARDS)
def test_a_streaming_build_killed_while_it_writes_shards_resumes_identically(tmp_path, point):
    """Killed at its N-th shard, twice (a fresh run always writes that many; the resumed one may
    have fewer left), a streaming build resumes to the clean build's cache."""
    inputs = make_corpus(tmp_path / "in")
    opts = dict(OPTS, shuffle=False)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **opts)
    got = tmp_path / "resumed"
    assert run_to_pause(inputs, got, opts, point, tmp_path / "trace.txt") == point
    run_to_pause(inputs, got, opts, point, tmp_path / "trace.txt")
    tokshuf.build_cache(inputs, got, **opts)
    assert_same_cache(got, want)


@pytest.mark.parametrize("point", ["stage2.group:2", "stage2.shard:20"])
def test_killed_between_cell_groups_resumes_identically(tmp_path, point):
    """A small memory budget makes stage 2 walk the cells in many groups, with chunks that
    straddle two groups; killed mid-way, the resumed run must rebuild the same carry-over."""
    inputs = make_corpus(tmp_path / "in")
    opts = dict(OPTS, num_local_cells=24, memory_limit=16 << 10)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **opts)
    got = tmp_path / "resumed"
    for _ in range(3):
        assert run_to_pause(inputs, got, opts, point, tmp_path / "trace.txt") == point
    tokshuf.build_cache(inputs, got, **opts)
    assert_same_cache(got, want)


def damage_unlisted_shard(out: Path) -> None:
    # The last listed line taken back: its shard is then one the killed run left unlisted.
    lines = (out / "manifest.jsonl").read_text().splitlines(keepends=True)
    (out / "manifest.jsonl").write_text("".join(lines[:-1]))
    shard = out / f"shard_{len(lines) - 1:08d}.tar"
    data = bytearray(shard.read_bytes())
    data[1024 + 512 + 128] ^= 1  # an id of member 1: the size, the headers, all still fine
    shard.write_bytes(bytes(data))


def truncate_listed_shard(out: Path) -> None:
    shard = out / "shard_00000000.tar"
    shard.write_bytes(shard.read_bytes()[:1024])


def flip_spill_bytes(out: Path) -> None:
    # A byte of every spill the killed run finished, changed as a failing disk (or a person in
    # the work folder) would: the resumed run must tokenize those files again, not shard them.
    spills = sorted((out / ".tokshuf-work").glob("f*.ctx"))
    assert spills
    for spill in spills:
        data = bytearray(spill.read_bytes())
        for at in range(1, len(data), 997):
            data[at] ^= 1
        spill.write_bytes(bytes(data))


def lose_unsynced_work_files(out: Path) -> None:
    # A power cut before the kernel wrote the work folder out: a one-machine build fsyncs
    # neither its spills nor their summaries, so after a reboot a spill may be short (its last
    # pages lost) or empty, and a summary empty or cut short.
    work = out / ".tokshuf-work"
    spills = sorted(work.glob("f*.ctx"))
    assert len(spills) >= 3
    for k, spill in enumerate(spills):
        if k % 3 == 2:
            summary = spill.with_suffix(".json")
            summary.write_bytes(summary.read_bytes()[: [0, 40][k % 2]])
            continue
        data = spill.read_bytes()
        spill.write_bytes(data[: len(data) // 2 // 4096 * 4096] if k % 3 == 0 else b"")


def lose_unsynced_work_record(out: Path) -> None:
    # The same for the work folder's record of the recipe and the inputs: without it the
    # killed run's shards cannot be trusted, and the build starts over.
    (out / ".tokshuf-work" / "recipe.json").write_bytes(b"")


def complete_too_early(out: Path) -> None:
    meta = json.loads((out / "tokshuf.json").read_text())
    (out / "tokshuf.json").write_text(json.dumps(dict(meta, status="complete")))


@pytest.mark.parametrize(
    "damage",
    [
        damage_unlisted_shard,
        truncate_listed_shard,
        flip_spill_bytes,
        lose_unsynced_work_files,
        lose_unsynced_work_record,
        complete_too_early,
    ],
)
def test_what_a_killed_run_left_damaged_is_not_trusted(tmp_path, damage):
    """A resumed build writes again any shard no manifest line vouches for, rather than hash
    it (which would bless the damage: verify --full could not see it then), and tokenizes again
    a file whose spill no longer has its checksum (changed, or cut short by a power cut) or
    whose summary cannot be read; a tokshuf.json that says complete is checked before the build
    returns it."""
    inputs = make_corpus(tmp_path / "in")
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **OPTS)
    got = tmp_path / "resumed"
    assert run_to_pause(inputs, got, OPTS, "stage2.shard:8", tmp_path / "trace.txt") is not None
    assert len((got / "manifest.jsonl").read_text().splitlines()) >= 1
    damage(got)
    if damage is complete_too_early:
        with pytest.raises(tokshuf.CacheCorruptError, match="says complete, but the cache is not"):
            tokshuf.build_cache(inputs, got, **OPTS)
        assert (got / ".tokshuf-work").is_dir()  # the spills are kept for a rebuild
        tokshuf.build_cache(inputs, got, overwrite=True, **OPTS)
    else:
        tokshuf.build_cache(inputs, got, **OPTS)
    assert_same_cache(got, want)


@pytest.mark.parametrize("how", ["work folder removed", "local_cell_dir given"])
def test_an_input_edited_while_the_work_record_is_out_of_sight_is_not_mixed_in(tmp_path, how):
    """The work folder records each input's size and mtime; without that record (removed, or
    elsewhere under local_cell_dir) the killed run's shards cannot be trusted, so a same-size
    edit must give the cache of the edited inputs, not a mix of the old and the new."""
    inputs = make_corpus(tmp_path / "in")
    got = tmp_path / "resumed"
    assert run_to_pause(inputs, got, OPTS, "stage2.shard:8", tmp_path / "trace.txt") is not None
    plain = next(p for p in inputs if p.suffix == ".jsonl")
    text = plain.read_text()
    plain.write_text(text.replace("a", "e", 50))  # same size, other ids
    extra = {}
    if how == "work folder removed":
        shutil.rmtree(got / ".tokshuf-work")
    else:
        extra = dict(local_cell_dir=tmp_path / "cells")
    tokshuf.build_cache(inputs, got, **OPTS, **extra)
    want = tmp_path / "clean"
    tokshuf.build_cache(inputs, want, **OPTS)
    assert_same_cache(got, want)


def timed_build(inputs, out, opts) -> float:
    t0 = time.monotonic()
    proc = start_build(inputs, out, opts, {})
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    return time.monotonic() - t0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "streaming"])
def test_killed_at_random_moments_resumes_identically(tmp_path, shuffle, seed):
    rng = random.Random(7 + 10 * seed + shuffle)
    opts = dict(OPTS, shuffle=shuffle)
    inputs = make_corpus(tmp_path / "in")
    want = tmp_path / "clean"
    clean_s = timed_build(inputs, want, opts)
    startup_s = timed_build(inputs, want, opts)  # a complete cache: start-up cost only

    # Kills after start-up plus a small random share of the build, so each run gets a little
    # further and many runs are needed; where a kill lands is left to chance.
    got = tmp_path / "resumed"
    kills = 0
    for _ in range(10):
        delay = startup_s + rng.uniform(0.0, 0.2) * max(clean_s - startup_s, 0.1)
        if not run_and_kill_after(inputs, got, opts, delay):
            break
        kills += 1
    # How far each run gets depends on machine load; the named-point tests above guarantee
    # that every phase is hit, this one only needs some kill to have landed somewhere.
    assert kills >= 1
    tokshuf.build_cache(inputs, got, **opts)
    assert_same_cache(got, want)
