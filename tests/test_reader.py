"""tokshuf.Cache and tokshuf.Reader on real built caches: contents, validation, seek and resume
(in new processes, also across world sizes), single pass, fork safety, dtypes, CLI."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tokshuf
from support.corpus import make_docs, write_jsonl
from support.reader import FORMATS, addresses, write_cache

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    """Small real caches: npy shuffled, npy unshuffled (several short chunks), json.gz."""
    base = tmp_path_factory.mktemp("reader")
    files = [write_jsonl(base / "in" / f"{k}.jsonl", make_docs(20 + 7 * k, k)) for k in range(3)]
    out = {}
    for name, kw in {
        "npy": dict(format="npy"),
        "flat": dict(format="npy", shuffle=False),
        "jsongz": dict(format="json.gz"),
    }.items():
        tokshuf.build_cache(files, base / name, seqlen=24, chunk_size=7, progress=False, threads=1, **kw)
        out[name] = base / name
    return out


def tar_contexts(cache_dir: Path):
    """Every context of a cache read with tarfile/numpy only, in manifest order."""
    meta = json.loads((cache_dir / "tokshuf.json").read_text())
    out = []
    for line in (cache_dir / "manifest.jsonl").read_text().splitlines():
        with tarfile.open(cache_dir / (json.loads(line)["shard"] + ".tar")) as tar:
            for m in tar.getmembers():
                data = tar.extractfile(m).read()
                if meta["format"] == "npy":
                    import io

                    out.append(np.load(io.BytesIO(data)).astype(np.int64))
                else:
                    out.append(np.array(json.loads(gzip.decompress(data)), dtype=np.int64))
    return np.stack(out)


@pytest.mark.parametrize("name", ["npy", "flat", "jsongz"])
def test_cache_contents_equal_the_tars(caches, name):
    cache = tokshuf.Cache(caches[name])
    want = tar_contexts(caches[name])
    assert len(cache) == len(want) == cache.metadata["num_contexts"]
    assert cache.dtype == np.uint16 and cache.seqlen == 24
    np.testing.assert_array_equal(cache[0], want[0])
    np.testing.assert_array_equal(cache[-1], want[-1])
    np.testing.assert_array_equal(cache.get_batch(range(len(cache)), dtype="int64"), want)
    np.testing.assert_array_equal(cache[3:9], want[3:9])
    with pytest.raises(IndexError):
        cache[len(cache)]
    r = tokshuf.Reader(cache, batch_size=5, single_pass=True, dtype="int64")
    np.testing.assert_array_equal(np.concatenate(list(r)), want)


def test_json_gz_and_npy_hold_the_same_contexts(caches):
    a, b = tokshuf.Cache(caches["npy"]), tokshuf.Cache(caches["jsongz"])
    np.testing.assert_array_equal(a.get_batch(range(len(a))), b.get_batch(range(len(b))))
    ra = tokshuf.Reader(a, batch_size=6, world_size=3, rank=2, seed=4)
    rb = tokshuf.Reader(b, batch_size=6, world_size=3, rank=2, seed=4)
    for _ in range(40):
        np.testing.assert_array_equal(next(ra), next(rb))


# ---- validation ----------------------------------------------------------------------------
def _corrupt_cases():
    def meta(f):
        def go(d):
            m = json.loads((d / "tokshuf.json").read_text())
            f(m)
            (d / "tokshuf.json").write_text(json.dumps(m))

        return go

    def manifest(f):
        def go(d):
            lines = [json.loads(x) for x in (d / "manifest.jsonl").read_text().splitlines()]
            f(lines)
            (d / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

        return go

    def truncate(d):
        p = d / "shard_00000001.tar"
        p.write_bytes(p.read_bytes()[:-600])

    return {
        "missing shard": (lambda d: (d / "shard_00000002.tar").unlink(), "shard_00000002.tar"),
        "truncated shard": (truncate, "shard_00000001.tar"),
        "building": (meta(lambda m: m.update(status="building")), "tokshuf.json"),
        "format version": (meta(lambda m: m.update(format_version=2)), "tokshuf.json"),
        "bad dtype": (meta(lambda m: m.update(dtype="float32")), "tokshuf.json"),
        "num_contexts": (meta(lambda m: m.update(num_contexts=m["num_contexts"] + 1)), "manifest.jsonl"),
        "num_chunks": (meta(lambda m: m.update(num_chunks=m["num_chunks"] - 1)), "manifest.jsonl"),
        "dotdot": (manifest(lambda ls: ls[0].update(shard="../shard_00000000")), "manifest.jsonl"),
        "absolute": (manifest(lambda ls: ls[0].update(shard="/etc/passwd")), "manifest.jsonl"),
        "negative": (manifest(lambda ls: ls[0].update(num_sequences=-3)), "manifest.jsonl"),
        "too many": (manifest(lambda ls: ls[0].update(num_sequences=10**6)), "manifest.jsonl"),
        "bytes": (manifest(lambda ls: ls[1].update(bytes=ls[1]["bytes"] + 1)), "shard_00000001.tar"),
        "garbage meta": (lambda d: (d / "tokshuf.json").write_text("{nope"), "tokshuf.json"),
        "torn manifest": (
            lambda d: (d / "manifest.jsonl").write_text((d / "manifest.jsonl").read_text()[:-5]),
            "manifest.jsonl",
        ),
    }


# Checked when a shard is first read, not when the cache is opened (opening lists the folder
# once and stats nothing, so that a cache of 100,000 chunks opens in milliseconds).
_ON_FIRST_READ = {"truncated shard", "bytes"}


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
@pytest.mark.parametrize("fmt", FORMATS)
def test_corrupt_caches_are_rejected_naming_the_file(tmp_path, case, fmt):
    d = write_cache(tmp_path / "c", [4, 4, 4, 2], 4, fmt=fmt)
    tokshuf.Cache(d)  # intact: opens
    damage, culprit = _corrupt_cases()[case]
    damage(d)
    if case in _ON_FIRST_READ:
        cache = tokshuf.Cache(d)
        cache[:4]  # other shards read fine
        with pytest.raises(tokshuf.CacheCorruptError) as e:
            cache[:]
    else:
        with pytest.raises(tokshuf.CacheCorruptError) as e:
            tokshuf.Cache(d)
    assert culprit in str(e.value)


def test_tampered_members_are_caught_on_first_read(tmp_path):
    d = write_cache(tmp_path / "n", [3, 3], 3)
    p = d / "shard_00000001.tar"
    data = bytearray(p.read_bytes())
    data[0:12] = b"evil_name.np"  # same size, wrong member name
    p.write_bytes(bytes(data))
    cache = tokshuf.Cache(d)
    cache[0]
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000001.tar"):
        cache[4]
    d = write_cache(tmp_path / "j", [3, 3], 3, fmt="json.gz")
    p = d / "shard_00000000.tar"
    data = bytearray(p.read_bytes())
    data[512 + 20] ^= 0xFF  # inside the first gzip member
    p.write_bytes(bytes(data))
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000000.tar"):
        tokshuf.Cache(d)[0]


def test_missing_folder_and_options(tmp_path, caches):
    with pytest.raises(tokshuf.TokshufError):
        tokshuf.Cache(tmp_path / "nope")
    for bad in [
        dict(batch_size=0),
        dict(batch_size=6, world_size=4),
        dict(batch_size=4, rank=1),
        dict(batch_size=4, ideal_readers=0),
        dict(batch_size=4, dtype="float32"),
        dict(batch_size=4, dtype=">i4"),  # batches are in the machine's byte order
        dict(batch_size=2**64),
        dict(batch_size=4, ideal_readers=2**64),
    ]:
        with pytest.raises(tokshuf.ConfigError):
            tokshuf.Reader(caches["npy"], **bad)
    with pytest.raises(tokshuf.ConfigError, match="timeout"):
        tokshuf.Cache(caches["npy"], follow=True, timeout="x")
    with pytest.raises(TypeError):
        tokshuf.Cache(caches["npy"])[1.5]
    cache = tokshuf.Cache(caches["npy"])
    for bad in ([1.5], ["7"], [None]):  # int() took the first two as 1 and 7
        with pytest.raises(TypeError, match="integers"):
            cache.get_batch(bad)
    with pytest.raises(IndexError, match=f"context {-len(cache) - 1} out of range"):
        cache.get_batch([-len(cache) - 1])
    d = write_cache(tmp_path / "big", [2], 2)
    meta = json.loads((d / "tokshuf.json").read_text())
    with pytest.raises(tokshuf.ConfigError):  # uint32 cache into uint16 batches
        tokshuf.Reader(d, batch_size=2, dtype="uint16")
    with pytest.raises(tokshuf.ConfigError, match="uint16 cannot hold"):  # and random access
        tokshuf.Cache(d).get_batch([0, 1], dtype="uint16")
    assert meta["dtype"] == "uint32"


@pytest.mark.parametrize(
    "kw",
    [
        dict(batch_size=10**11, prefetch=0),  # one batch: terabytes
        dict(batch_size=8, prefetch=2**40),  # the read-ahead: 2^40 batches
        dict(batch_size=2**20, prefetch=4096, threads=4096),  # 8,000 batches in flight
    ],
)
def test_requests_beyond_memory_are_refused_not_fatal(caches, kw):
    # Left to the allocator these end the process (Rust aborts when an allocation fails):
    # refused with a message instead, before anything is allocated.
    with pytest.raises(tokshuf.ConfigError, match="more than this machine's memory"):
        next(tokshuf.Reader(caches["npy"], **kw))


@pytest.mark.parametrize("threads", [4097, 10**9, 2**63])
def test_thread_counts_beyond_any_machine_are_refused(caches, threads):
    with pytest.raises(tokshuf.ConfigError, match="threads must be between 1 and 4096"):
        next(tokshuf.Reader(caches["npy"], batch_size=8, prefetch=4, threads=threads))


def test_indices_beyond_the_range_are_config_errors(caches):
    r = tokshuf.Reader(caches["npy"], batch_size=8)
    for call in (lambda: r.batch_at(2**62), lambda: r.batch_at(2**59 + 3), lambda: r.locate(2**64)):
        with pytest.raises(tokshuf.ConfigError):
            call()
    state = r.state_dict()
    with pytest.raises(tokshuf.StateMismatchError):
        r.load_state_dict({**state, "options": None})
    assert np.array_equal(r.batch_at(1), tokshuf.Reader(caches["npy"], batch_size=8, start_step=1).__next__())


# ---- seek and resume ---------------------------------------------------------------------
RESUME_SCRIPT = r"""
import json, sys, numpy as np, tokshuf
cfg = json.loads(sys.argv[1])
r = tokshuf.Reader(cfg["cache"], batch_size=cfg["batch"], rank=cfg["rank"], world_size=cfg["world"],
                   seed=7, ideal_readers=cfg["rstar"], single_pass=cfg.get("single", False))
if cfg.get("state"):
    r.load_state_dict(cfg["state"])
out = [next(r).tolist() for _ in range(cfg["steps"])]
print(json.dumps({"batches": out, "state": r.state_dict()}))
"""


def run_reader(**cfg):
    p = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, check=False
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def global_batches(cache, batch, steps, start=0, rstar=3):
    r = tokshuf.Reader(cache, batch_size=batch, seed=7, ideal_readers=rstar, start_step=start)
    return [next(r).tolist() for _ in range(steps)]


@pytest.mark.parametrize("world_before,world_after", [(1, 1), (2, 2), (2, 4), (4, 1), (3, 6)])
def test_resume_in_a_new_process_equals_straight_read(caches, world_before, world_after):
    cache, batch, k, m = str(caches["flat"]), 12, 5, 7
    straight = global_batches(cache, batch, k + m)
    states = set()
    for rank in range(world_before):
        first = run_reader(cache=cache, batch=batch, rank=rank, world=world_before, rstar=3, steps=k)
        for b, rows in enumerate(first["batches"]):
            assert rows == straight[b][rank::world_before]
        states.add(json.dumps(first["state"], sort_keys=True))
    state = json.loads(states.pop())
    assert not states or all(json.loads(s)["next_example"] == state["next_example"] for s in states)
    assert state["step"] == k and state["next_example"] == k * batch
    for rank in range(world_after):
        rest = run_reader(cache=cache, batch=batch, rank=rank, world=world_after, rstar=3, steps=m, state=state)
        for b, rows in enumerate(rest["batches"]):
            assert rows == straight[k + b][rank::world_after]


def test_seek_forms(caches):
    cache = tokshuf.Cache(caches["npy"])
    r = tokshuf.Reader(cache, batch_size=4, seed=1)
    straight = [next(r) for _ in range(6)]
    r.seek(step=3)
    np.testing.assert_array_equal(next(r), straight[3])
    r.seek(example=8)
    np.testing.assert_array_equal(next(r), straight[2])
    r.seek(tokens=4 * 4 * cache.seqlen)
    np.testing.assert_array_equal(next(r), straight[4])
    assert r.step == 5
    with pytest.raises(tokshuf.ConfigError):
        r.seek(tokens=cache.seqlen + 1)
    with pytest.raises(tokshuf.ConfigError):
        r.seek(step=1, example=2)
    r2 = tokshuf.Reader(cache, batch_size=4, seed=1, start_step=5, prefetch=0)
    np.testing.assert_array_equal(next(r2), straight[5])
    np.testing.assert_array_equal(r2.batch_at(1), straight[1])
    r.seek(example=6)  # batches need not start on a multiple of the batch size
    both = np.concatenate([straight[1], straight[2]])
    np.testing.assert_array_equal(next(r), both[2:6])


def test_state_mismatch(caches, tmp_path):
    r = tokshuf.Reader(caches["npy"], batch_size=4, seed=1)
    next(r)
    state = json.loads(json.dumps(r.state_dict()))
    for other in [dict(seed=2), dict(ideal_readers=5), dict(reshuffle=False), dict(single_pass=True)]:
        with pytest.raises(tokshuf.StateMismatchError):
            tokshuf.Reader(caches["npy"], batch_size=4, **{"seed": 1, **other}).load_state_dict(state)
    with pytest.raises(tokshuf.StateMismatchError):
        tokshuf.Reader(caches["npy"], batch_size=8, seed=1).load_state_dict(state)
    with pytest.raises(tokshuf.StateMismatchError, match="another cache"):
        tokshuf.Reader(caches["jsongz"], batch_size=4, seed=1).load_state_dict(state)
    with pytest.raises(tokshuf.StateMismatchError):
        r.load_state_dict({"next_example": 3})
    r2 = tokshuf.Reader(caches["npy"], batch_size=4, seed=1, world_size=2, rank=1)
    r2.load_state_dict(state)
    assert r2.step == 1


# ---- single pass ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["npy", "flat", "jsongz"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("batch_per_rank", [1, 5])
def test_single_pass_yields_every_context_once(tmp_path, caches, name, world, batch_per_rank):
    sizes = tokshuf.Cache(caches[name]).chunk_sizes
    d = write_cache(tmp_path / "s", sizes, max(sizes))  # same layout, addressable contexts
    batch = world * batch_per_rank
    seen, steps = [], []
    for rank in range(world):
        r = tokshuf.Reader(d, batch_size=batch, rank=rank, world_size=world, single_pass=True, prefetch=rank)
        got = list(r)
        steps.append(len(got))
        seen += [a for b in got for a in addresses(b)]
        assert r.num_steps == len(got)
    assert len(set(steps)) == 1  # every rank yields the same number of batches
    assert sorted(seen) == [(c, i) for c, n in enumerate(sizes) for i in range(n)]
    dropped = list(tokshuf.Reader(d, batch_size=batch, single_pass=True, drop_last=True))
    assert all(len(b) == batch for b in dropped) and len(dropped) == sum(sizes) // batch


# ---- threads, fork, dtypes ----------------------------------------------------------------
def test_prefetch_settings_do_not_change_batches(caches):
    ref = global_batches(str(caches["npy"]), 8, 30)
    for prefetch, threads in [(0, None), (1, 1), (3, 2), (8, 4)]:
        r = tokshuf.Reader(caches["npy"], batch_size=8, seed=7, ideal_readers=3, prefetch=prefetch, threads=threads)
        assert [next(r).tolist() for _ in range(30)] == ref


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_reader_keeps_working_after_fork(caches):
    r = tokshuf.Reader(caches["npy"], batch_size=8, seed=7, ideal_readers=3, prefetch=4, threads=2)
    ref = global_batches(str(caches["npy"]), 8, 20)
    assert [next(r).tolist() for _ in range(5)] == ref[:5]  # read-ahead threads are running now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's threads are gone; the reader must start its own
        ok = [next(r).tolist() for _ in range(15)] == ref[5:]
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert [next(r).tolist() for _ in range(15)] == ref[5:]


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint16", "uint32", np.int64])
def test_dtypes(caches, dtype):
    r = tokshuf.Reader(caches["npy"], batch_size=4, dtype=dtype)
    b = next(r)
    assert b.dtype == np.dtype(dtype) and b.shape == (4, 24)
    ref = next(tokshuf.Reader(caches["npy"], batch_size=4, dtype="int64"))
    np.testing.assert_array_equal(b.astype(np.int64), ref)
    x, y = tokshuf.shift_targets(b)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
    assert x.shape == (4, 23)


def test_readers_of_one_cache_share_its_batch_buffers(caches):
    """A Cache hands the buffers of batches freed by one reader to the next (a new single pass
    reuses them); readers of other dtypes and batch sizes, interleaved, still read their own."""
    cache = tokshuf.Cache(caches["npy"])
    want = {
        (dtype, batch): [
            b.astype(np.int64).tolist()
            for b in tokshuf.Reader(caches["npy"], batch_size=batch, dtype=dtype, single_pass=True)
        ]
        for dtype in ("uint16", "int64")
        for batch in (3, 4)
    }
    readers = {key: tokshuf.Reader(cache, batch_size=key[1], dtype=key[0], single_pass=True) for key in want}
    got = {key: [] for key in want}
    while readers:
        for key, r in list(readers.items()):
            b = next(r, None)
            if b is None:
                del readers[key]
            else:
                got[key].append(b.astype(np.int64).tolist())
    assert got == want

    def address(b):
        return b.__array_interface__["data"][0]

    def one_batch():
        return next(tokshuf.Reader(cache, batch_size=16, dtype="int64", prefetch=0, single_pass=True))

    first = one_batch()
    held = address(first)
    del first
    # Memory freed now would go to the next allocation of its size: this one.
    taken = np.empty(16 * 24, np.int64)
    again = one_batch()
    assert address(taken) != held
    assert address(again) == held, "the second single pass fills the first one's buffer"


def test_reader_pickles(caches):
    import pickle

    r = tokshuf.Reader(caches["npy"], batch_size=4, seed=2)
    next(r)
    r2 = pickle.loads(pickle.dumps(r))
    np.testing.assert_array_equal(next(r2), next(r))


# ---- CLI -------------------------------------------------------------------------------------
def cli(*args):
    p = subprocess.run([sys.executable, "-m", "tokshuf", *map(str, args)], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_cli_read_and_inspect(caches):
    out = cli("read", caches["npy"], "--batch-size", 4, "--steps", 3, "--rank", 1, "--world-size", 2)
    rows = [line for line in out.splitlines() if line.startswith("step")]
    assert len(rows) == 3 and all("rows 2" in line for line in rows)
    assert out == cli("read", caches["npy"], "--batch-size", 4, "--steps", 3, "--rank", 1, "--world-size", 2)
    assert out != cli("read", caches["npy"], "--batch-size", 4, "--steps", 3, "--rank", 0, "--world-size", 2)
    info = cli("inspect", caches["npy"], "-n", 1)
    assert "num_contexts" in info and "context 0" in info and "tiktoken:r50k_base" in info
    for args in (["/nonexistent", "--batch-size", "2"], [caches["npy"], "--batch-size", "4", "--steps", str(10**20)]):
        p = subprocess.run([sys.executable, "-m", "tokshuf", "read", *map(str, args)], capture_output=True, text=True)
        assert p.returncode == 1 and "tokshuf: error" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("fmt", FORMATS)
def test_lazy_open_checks_each_shard_on_first_read(tmp_path, fmt):
    d = write_cache(tmp_path / "c", [4, 4, 4, 2], 4, fmt=fmt)
    p = d / "shard_00000001.tar"
    p.write_bytes(p.read_bytes()[:-600])
    (d / "shard_00000002.tar").unlink()
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000002\.tar"):
        tokshuf.Cache(d)
    cache = tokshuf.Cache(d, check_files=False)
    assert addresses(cache.get_batch([0, 13])) == [(0, 0), (3, 1)]
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000001.tar"):
        cache[5]
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000002.tar"):
        cache[9]
