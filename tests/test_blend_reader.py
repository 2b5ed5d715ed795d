"""A Reader over a Blend (DESIGN §7 read as §6): global batches equal the composition of the two
pure-Python references (blend_helpers.reference_blend), for every world size; seek, resume in a
new process with another world size, single pass, state checks, CLI.

Synthetic caches carry (chunk, index, cache number) in their first three ids, so every row says
which context of which cache it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tokshuf
from hypothesis import given, settings
from hypothesis import strategies as st
from support.blend import (
    TOK,
    ref_draws,
    ref_quantise,
    reference_blend,
    reference_blend_single_pass,
    single_pass_length,
    write_blend_caches,
)
from support.reader import context_ids, reference_example_far, tagged_addresses, write_cache

# Random weights can round to 0 draws per period; that is warned about (test_blend.py) and fine.
pytestmark = pytest.mark.filterwarnings("ignore:blend. the share:UserWarning")


@st.composite
def blends(draw, max_components=3):
    """(layouts, weights, quantum): 1-3 caches of mostly full chunks, some short ones."""
    n = draw(st.integers(1, max_components))
    layouts = []
    for _ in range(n):
        cs = draw(st.integers(1, 5))
        sizes = [cs if draw(st.integers(0, 3)) else draw(st.integers(1, cs)) for _ in range(draw(st.integers(1, 6)))]
        layouts.append((sizes, cs))
    weights = draw(st.lists(st.floats(0.05, 20), min_size=n, max_size=n))
    quantum = draw(st.one_of(st.integers(n, n + 30), st.just(65536)))
    return layouts, weights, quantum


def read_global(blend, batch_size, world, steps, **kw):
    """Global batches as (cache, chunk, index) rows, reassembled from `world` ranks' slices."""
    per_rank = []
    for rank in range(world):
        r = tokshuf.Reader(blend, batch_size=batch_size, rank=rank, world_size=world, **kw)
        per_rank.append([tagged_addresses(b) for b in (next(r) for _ in range(steps))])
        assert all(len(b) == batch_size // world for b in per_rank[-1])
    out = []
    for b in range(steps):
        got = [None] * batch_size
        for rank in range(world):
            for j, addr in enumerate(per_rank[rank][b]):
                got[rank + j * world] = addr  # rank r holds examples b*B + r + j*R
        out.append(got)
    return out


@settings(max_examples=30)
@given(
    blend=blends(),
    r_star=st.sampled_from([1, 3, 8]),
    batch_size=st.sampled_from([1, 4, 6, 12]),
    seed=st.integers(0, 2**64 - 1),
    reshuffle=st.booleans(),
    fmt=st.sampled_from(["npy", "json.gz"]),
)
def test_blend_reader_equals_reference_for_every_world_size(blend, r_star, batch_size, seed, reshuffle, fmt):
    layouts, weights, quantum = blend
    total = sum(sum(s) for s, _ in layouts)
    steps = max(2, math.ceil(min(3 * total + 8, 96) / batch_size))
    want = reference_blend(layouts, weights, quantum, r_star, seed, reshuffle, steps * batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_blend_caches(Path(tmp), layouts, fmt=fmt)
        b = tokshuf.Blend(list(zip(paths, weights)), seed=seed, quantum=quantum)
        for world in [w for w in (1, 2, 3, 4, 6, 12) if batch_size % w == 0]:
            got = read_global(
                b, batch_size, world, steps, ideal_readers=r_star, reshuffle=reshuffle, prefetch=world % 3
            )
            flat = [a for batch in got for a in batch]
            assert flat == want, (world, quantum)


# ---- fixed blend for seek, resume, single pass ---------------------------------------------
LAYOUTS = [([4, 4, 2, 4, 3], 4), ([3, 3, 3], 3), ([5, 1, 5, 5, 5, 5, 2], 5)]
WEIGHTS = [0.5, 0.2, 0.3]
QUANTUM = 23
SEED = 11


@pytest.fixture(scope="module")
def blend_paths(tmp_path_factory):
    return [str(p) for p in write_blend_caches(tmp_path_factory.mktemp("blend"), LAYOUTS)]


def make_blend(paths, weights=WEIGHTS, seed=SEED, quantum=QUANTUM):
    return tokshuf.Blend(list(zip(paths, weights)), seed=seed, quantum=quantum)


def test_reader_takes_seed_and_r_star_from_the_blend(blend_paths):
    b = make_blend(blend_paths)
    r = tokshuf.Reader(b, batch_size=4)
    assert r.seed == SEED and r.cache is b
    # Default R*: the smallest of the caches' defaults (min(64, chunks) each: 5, 3, 7).
    assert b.ideal_readers == r.ideal_readers == 3
    assert tokshuf.Reader(b, batch_size=4, seed=SEED).seed == SEED
    with pytest.raises(tokshuf.ConfigError, match="blend's seed"):
        tokshuf.Reader(b, batch_size=4, seed=SEED + 1)
    want = reference_blend(LAYOUTS, WEIGHTS, QUANTUM, 3, SEED, True, 40)
    assert [a for _ in range(10) for a in tagged_addresses(next(r))] == want


def test_seek_to_any_step_equals_reading_up_to_it(blend_paths):
    b = make_blend(blend_paths)
    batch, steps = 6, 40
    r = tokshuf.Reader(b, batch_size=batch, ideal_readers=2)
    straight = [next(r) for _ in range(steps)]
    for s in [0, 1, 7, 13, 39, 5, 22]:
        r.seek(step=s)
        got = [next(r) for _ in range(steps - s)]
        for a, c in zip(got, straight[s:]):
            np.testing.assert_array_equal(a, c)
    flat = np.concatenate(straight)
    for x in [1, 17, 100]:
        r.seek(example=x)
        np.testing.assert_array_equal(next(r), flat[x : x + batch])
        r.seek(tokens=x * r.seqlen)
        np.testing.assert_array_equal(next(r), flat[x : x + batch])
    r2 = tokshuf.Reader(b, batch_size=batch, ideal_readers=2, start_step=9, world_size=3, rank=2, prefetch=0)
    np.testing.assert_array_equal(next(r2), straight[9][2::3])
    np.testing.assert_array_equal(r2.batch_at(31), straight[31][2::3])


@pytest.mark.parametrize("reshuffle", [True, False])
def test_far_seek_equals_the_definition(blend_paths, reshuffle):
    """Blended example m of DESIGN §7 (one period of the loop, folded) composed with the far
    §6 reference of each cache, at steps up to 10^12."""
    b = make_blend(blend_paths)
    q, _ = ref_quantise(WEIGHTS, QUANTUM)
    period = [(k, c) for k, c, _ in ref_draws(q, QUANTUM)]
    batch, r_star = 4, 3
    r = tokshuf.Reader(b, batch_size=batch, world_size=2, rank=1, ideal_readers=r_star, reshuffle=reshuffle, prefetch=0)
    for step in [10**3 + 7, 10**9, 10**12 + 3]:
        r.seek(step=step)
        got = tagged_addresses(next(r))
        want = []
        for m in range(step * batch + 1, (step + 1) * batch, 2):  # rank 1 of 2
            k, c = period[m % QUANTUM]
            e = (m // QUANTUM) * q[k] + c
            sizes, cs = LAYOUTS[k]
            want.append((k, *reference_example_far(sizes, cs, r_star, SEED, reshuffle, e)))
        assert got == want, step
        assert [r.locate(m)[0] for m in range(step * batch, step * batch + 4)] == [
            period[m % QUANTUM][0] for m in range(step * batch, step * batch + 4)
        ]


RESUME_SCRIPT = r"""
import json, sys, tokshuf
cfg = json.loads(sys.argv[1])
blend = tokshuf.Blend(list(zip(cfg["paths"], cfg["weights"])), seed=cfg["seed"], quantum=cfg["quantum"])
r = tokshuf.Reader(blend, batch_size=cfg["batch"], rank=cfg["rank"], world_size=cfg["world"], ideal_readers=2)
if cfg.get("state"):
    r.load_state_dict(cfg["state"])
out = [next(r).tolist() for _ in range(cfg["steps"])]
print(json.dumps({"batches": out, "state": r.state_dict()}))
"""


def run_reader(**cfg):
    cfg = {"weights": WEIGHTS, "seed": SEED, "quantum": QUANTUM, **cfg}
    p = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("world_before,world_after", [(2, 3), (4, 1), (1, 6)])
def test_resume_in_a_new_process_with_another_world_size(blend_paths, world_before, world_after):
    batch, k, m = 12, 4, 5
    r = tokshuf.Reader(make_blend(blend_paths), batch_size=batch, ideal_readers=2)
    straight = [next(r).tolist() for _ in range(k + m)]
    states = []
    for rank in range(world_before):
        first = run_reader(paths=blend_paths, batch=batch, rank=rank, world=world_before, steps=k)
        assert first["batches"] == [s[rank::world_before] for s in straight[:k]]
        states.append(first["state"])
    assert all(s["next_example"] == k * batch and s["fingerprint"] == states[0]["fingerprint"] for s in states)
    assert states[0]["cache"] == make_blend(blend_paths).fingerprint
    for rank in range(world_after):
        rest = run_reader(paths=blend_paths, batch=batch, rank=rank, world=world_after, steps=m, state=states[0])
        assert rest["batches"] == [s[rank::world_after] for s in straight[k:]]


def test_state_of_another_blend_or_order_is_refused(blend_paths):
    r = tokshuf.Reader(make_blend(blend_paths), batch_size=4)
    next(r)
    state = json.loads(json.dumps(r.state_dict()))
    same = tokshuf.Reader(make_blend(list(blend_paths)), batch_size=4, world_size=2, rank=1)
    same.load_state_dict(state)  # a blend rebuilt from the same caches and weights
    assert same.step == 1
    others = [
        tokshuf.Reader(make_blend(blend_paths, weights=[0.4, 0.3, 0.3]), batch_size=4),
        tokshuf.Reader(make_blend(blend_paths, seed=SEED + 1), batch_size=4),
        tokshuf.Reader(make_blend(blend_paths, quantum=QUANTUM + 1), batch_size=4),
        tokshuf.Reader(make_blend(blend_paths[::-1], weights=WEIGHTS[::-1]), batch_size=4),
        tokshuf.Reader(make_blend(blend_paths), batch_size=4, ideal_readers=5),
        tokshuf.Reader(make_blend(blend_paths), batch_size=4, reshuffle=False),
        tokshuf.Reader(blend_paths[0], batch_size=4, seed=SEED),
    ]
    for other in others:
        with pytest.raises(tokshuf.StateMismatchError):
            other.load_state_dict(state)


def test_blend_reader_pickles(blend_paths):
    import pickle

    r = tokshuf.Reader(make_blend(blend_paths), batch_size=4, world_size=2, rank=1)
    next(r)
    r2 = pickle.loads(pickle.dumps(r))
    for _ in range(5):
        np.testing.assert_array_equal(next(r2), next(r))


# ---- single pass ---------------------------------------------------------------------------
@settings(max_examples=15)
@given(blend=blends(), world=st.sampled_from([1, 2, 3]), per_rank=st.sampled_from([1, 4]))
def test_single_pass_covers_every_example_of_every_cache(blend, world, per_rank):
    layouts, weights, quantum = blend
    batch = world * per_rank
    n = single_pass_length(layouts, weights, quantum)
    want = reference_blend_single_pass(layouts, weights, quantum, n)
    with tempfile.TemporaryDirectory() as tmp:
        b = tokshuf.Blend(list(zip(write_blend_caches(Path(tmp), layouts), weights)), quantum=quantum)
        assert b.single_pass_length() == n
        got = [None] * n
        for rank in range(world):
            r = tokshuf.Reader(b, batch_size=batch, rank=rank, world_size=world, single_pass=True, prefetch=rank)
            assert r.num_examples == n
            batches = list(r)
            assert len(batches) == r.num_steps == -(-n // batch)  # every rank, same count
            for s, rows in enumerate(batches):
                for j, addr in enumerate(tagged_addresses(rows)):
                    got[s * batch + rank + j * world] = addr
        dropped = list(tokshuf.Reader(b, batch_size=batch, single_pass=True, drop_last=True))
    assert got == want
    assert set(got) == {
        (k, c, i) for k, (sizes, _) in enumerate(layouts) for c, m in enumerate(sizes) for i in range(m)
    }
    assert len(dropped) == n // batch and all(len(x) == batch for x in dropped)


# ---- whole rows of large batches -----------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_large_blend_batches_hold_every_row_whole(tmp_path, dtype):
    """Each cache of a blend fills its rows of a batch in one call; batches of 4 MiB and more
    are written with streaming stores, and the rows of one cache alternate with the other's,
    so neighbouring rows share cache lines: every id of every row is compared."""
    seqlen = 2051  # rows that start and end inside cache lines
    layouts = [([40, 40, 17], 40), ([30, 30], 30)]
    paths = [
        write_cache(tmp_path / f"c{k}", sizes, cs, seqlen=seqlen, tag=k, extra={"tokenizer": TOK})
        for k, (sizes, cs) in enumerate(layouts)
    ]
    blend = tokshuf.Blend(list(zip(paths, [0.6, 0.4])), seed=3, quantum=40)
    batch_size = 600  # 4.7 MiB in int32
    reader = tokshuf.Reader(blend, batch_size=batch_size, dtype=dtype, prefetch=0)
    for _ in range(2):
        batch = next(reader)
        assert batch.shape == (batch_size, seqlen) and batch.dtype == np.dtype(dtype)
        assert {int(row[2]) for row in batch} == {0, 1}
        for row in batch:
            want = context_ids(int(row[0]), int(row[1]), seqlen, int(row[2]))
            np.testing.assert_array_equal(row, want.astype(dtype))


# ---- CLI -----------------------------------------------------------------------------------
def cli(*args, ok=True):
    p = subprocess.run([sys.executable, "-m", "tokshuf", *map(str, args)], capture_output=True, text=True, check=False)
    assert (p.returncode == 0) == ok, p.stderr
    return p.stdout if ok else p.stderr


def test_cli_read_blend_same_global_checksums_for_every_world_size(blend_paths):
    specs = [x for p, w in zip(blend_paths, WEIGHTS) for x in ("--blend", f"{p}:{w}")]
    base = [
        "read",
        *specs,
        "--blend-quantum",
        QUANTUM,
        "--seed",
        SEED,
        "--batch-size",
        6,
        "--steps",
        5,
        "--ideal-readers",
        2,
    ]
    outs = {w: cli(*base, "--global", "--world-size", w) for w in (1, 2, 3)}
    body = {w: [x for x in o.splitlines() if not x.startswith("# blend")] for w, o in outs.items()}
    assert body[1] == body[2] == body[3] and len(body[1]) == 6
    # The checksums are those of the reader's global batches.
    r = tokshuf.Reader(make_blend(blend_paths), batch_size=6, ideal_readers=2, dtype="int64")
    digests = [hashlib.sha256(next(r).astype("<i8").tobytes()).hexdigest()[:16] for _ in range(5)]
    assert [line.split("sha256 ")[1] for line in body[1][:5]] == digests
    one_rank = cli(*base, "--rank", 1, "--world-size", 2)
    assert one_rank.count("rows 3") == 5 and one_rank != outs[2]
    assert "exactly one" in cli("read", blend_paths[0], *specs, "--batch-size", 2, ok=False)
    assert "exactly one" in cli("read", "--batch-size", 2, ok=False)
