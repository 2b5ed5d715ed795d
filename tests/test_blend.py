"""Weighted blends (DESIGN §7) against a plain pure-Python implementation of the greedy loop."""

from __future__ import annotations

import json
import pickle
import tempfile
import warnings
from fractions import Fraction
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest
import tokshuf
from hypothesis import given
from hypothesis import strategies as st
from support.blend import TOK, fake_cache, manifest_only_cache, ref_draws, ref_quantise
from tokshuf._cli_blend import add_blend_arguments, blend_from_args, parse_blend_spec
from tokshuf._core import BlendSchedule


def period_counts(schedule: BlendSchedule) -> np.ndarray:
    """C_i(j) for j = 0..D (counts after j draws), from the schedule's own period."""
    ks, _ = schedule.period()
    onehot = np.zeros((len(ks) + 1, schedule.num_datasets), dtype=np.int64)
    onehot[np.arange(1, len(ks) + 1), ks.astype(np.int64)] = 1
    return onehot.cumsum(axis=0)


MAX_LAG_SEEN: Dict[str, float] = {"lag": 0.0}

weights_st = st.lists(st.floats(min_value=1e-3, max_value=1e3), min_size=1, max_size=10)


@given(weights=weights_st, extra=st.integers(0, 300), periods=st.integers(1, 3), data=st.data())
def test_schedule_equals_reference_loop(weights, extra, periods, data):
    quantum = len(weights) + extra
    s = BlendSchedule(weights, quantum)
    q, raised = ref_quantise(weights, quantum)
    assert s.quanta == q and s.raised == raised and sum(q) == quantum
    sizes = data.draw(st.lists(st.integers(1, 40), min_size=len(q), max_size=len(q)))
    length = periods * quantum + data.draw(st.integers(0, quantum))
    ks, es = s.locate_many(np.arange(length, dtype=np.uint64))
    _, wrapped = s.locate_many(np.arange(length, dtype=np.uint64), np.array(sizes, dtype=np.uint64))
    for m, ((k, sample, counts), (k2, wrap, _)) in enumerate(zip(ref_draws(q, length), ref_draws(q, length, sizes))):
        assert (int(ks[m]), int(es[m])) == (k, sample) == s.locate(m)
        assert (int(ks[m]), int(wrapped[m])) == (k2, wrap) == s.locate(m, sizes)
        assert s.counts(m + 1) == counts
        assert s.position(k, sample) == m


@given(weights=weights_st, extra=st.integers(0, 2000))
def test_never_ahead_by_a_sample_and_exact_each_period(weights, extra):
    quantum = len(weights) + extra
    s = BlendSchedule(weights, quantum)
    q = np.array(s.quanta, dtype=np.int64)
    c = period_counts(s)
    j = np.arange(quantum + 1, dtype=np.int64)[:, None]
    lead = quantum * c - j * q  # D * (C_i(j) - j*q_i/D)
    lag = j * q - quantum * c
    assert lead.max() < quantum  # C_i(j) - j*q_i/D < 1 for every i and j
    assert (c[-1] == q).all()  # C_i = q_i at the end of the period
    for p in (1, 2, 7):
        assert s.counts(p * quantum) == [p * x for x in s.quanta]
    assert s.max_lead == pytest.approx(lead.max() / quantum)
    assert s.max_lag == pytest.approx(lag.max() / quantum)
    # Largest remainder: with nothing raised, every share is the floor or ceiling of the exact
    # share (raising takes units from the largest shares).
    total = sum(Fraction(w) for w in weights)
    if not s.raised:
        for i, w in enumerate(weights):
            assert abs(s.quanta[i] - Fraction(w) / total * quantum) < 1 + Fraction(1, 10**6)
    MAX_LAG_SEEN["lag"] = max(MAX_LAG_SEEN["lag"], float(lag.max()) / quantum)


def test_lag_can_exceed_one_and_is_reported(record_property):
    """The lag bound is not 1 for this rule: a pinned 20-dataset case lags by 1.24 samples.
    Also searches random blends and records the largest lag seen (lag is reported, not bounded)."""
    pinned = [45, 1, 1, 1, 1, 1, 1, 2, 10, 4, 48, 1, 1, 1, 14, 10, 48, 1, 1, 1]
    s = BlendSchedule([float(x) for x in pinned], sum(pinned))
    assert s.quanta == pinned
    c = period_counts(s)
    j = np.arange(sum(pinned) + 1)[:, None]
    lag = (j * np.array(pinned) - sum(pinned) * c).max() / sum(pinned)
    assert lag == pytest.approx(s.max_lag) and lag > 1.2
    rng = np.random.default_rng(0)
    worst = lag
    for _ in range(300):
        n = int(rng.integers(4, 30))
        w = list(rng.pareto(1.0, n) + 0.01)
        sched = BlendSchedule(w, int(rng.integers(n, 2000)))
        assert sched.max_lead < 1
        worst = max(worst, sched.max_lag)
    worst = max(worst, MAX_LAG_SEEN["lag"])
    record_property("max_lag_observed", worst)
    print(f"largest lag observed: {worst:.4f} samples")


def test_counts_after_every_prefix_many_datasets():
    rng = np.random.default_rng(3)
    weights = list(rng.uniform(0.1, 10, 60))
    s = BlendSchedule(weights, 997)
    for m, (_, _, counts) in enumerate(ref_draws(s.quanta, 2 * 997 + 50)):
        if m % 7 == 0:
            assert s.counts(m + 1) == counts


def test_construction_is_not_quadratic():
    """10,000 datasets at D = 65536 is what a scan per draw makes slow (6.5e8 steps); the
    tournament must cost about the same per draw for 100 and 10,000 datasets."""
    import time

    def build(n):
        w = list(np.random.default_rng(n).uniform(0.5, 2.0, n))
        t = time.perf_counter()
        BlendSchedule(w, 65536)
        return time.perf_counter() - t

    small = min(build(100) for _ in range(3))
    large = min(build(10_000) for _ in range(3))
    assert large < 40 * small + 0.05  # O(D log n): ~2x; O(D n) would be ~100x


# ---------------------------------------------------------------------------------------------
# Megatron's loop and the single-pass guarantee.


def megatron_loop(weights: Sequence[float], size: int) -> List[Tuple[int, int]]:
    """Megatron's build_blending_indices rule: error uses max(sample_idx, 1), not +1."""
    counts = [0] * len(weights)
    out = []
    for idx in range(size):
        x = max(float(idx), 1.0)
        k = max(range(len(weights)), key=lambda i: (weights[i] * x - counts[i], -i))
        out.append((k, counts[k]))
        counts[k] += 1
    return out


def test_megatron_counterexample_stays_in_range(tmp_path):
    sizes = [2, 2]
    # Megatron, asked for the 4 samples there are, draws a third sample of the 2-sample dataset.
    assert any(sample >= sizes[k] for k, sample in megatron_loop([0.1, 0.9], sum(sizes)))
    b = tokshuf.Blend([(fake_cache(tmp_path, "a", 2), 0.1), (fake_cache(tmp_path, "b", 2), 0.9)])
    n = b.single_pass_length()
    ks, es = b.locate_many(np.arange(max(n, 100_000)), single_pass=True)
    assert (es < b.sizes[ks]).all()
    seen = set(zip(ks[:n].tolist(), es[:n].tolist()))
    assert seen == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert len(set(zip(ks[: n - 1].tolist(), es[: n - 1].tolist()))) < 4  # n is the shortest
    assert all(b.locate(m, single_pass=True)[1] < 2 for m in range(0, 10**7, 9973))


@pytest.mark.slow
def test_thousand_datasets_single_pass(tmp_path):
    rng = np.random.default_rng(1000)
    sizes = rng.integers(1, 60, 1000)
    weights = rng.uniform(0.01, 1.0, 1000)
    comps = [(manifest_only_cache(tmp_path, f"c{i}", int(n)), float(w)) for i, (n, w) in enumerate(zip(sizes, weights))]
    b = tokshuf.Blend(comps)
    assert not b.raised
    n = b.single_pass_length()
    ks, es = b.locate_many(np.arange(n), single_pass=True)
    assert ks.max() == 999 and (es < b.sizes[ks]).all()
    covered = np.zeros(int(sizes.sum()), dtype=bool)
    covered[np.concatenate([[0], np.cumsum(sizes)[:-1]])[ks] + es.astype(np.int64)] = True
    assert covered.all()
    # Endless mode: each component's examples come in order 0, 1, 2, ... with no gaps.
    ks, es = b.locate_many(np.arange(2 * 65536 + 17))
    for k in range(0, 1000, 97):
        got = es[ks == k]
        assert (got == np.arange(len(got))).all()


# ---------------------------------------------------------------------------------------------
# tokshuf.Blend over caches.


@given(weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=6), data=st.data())
def test_blend_locates_like_reference(weights, data):
    sizes = data.draw(st.lists(st.integers(1, 30), min_size=len(weights), max_size=len(weights)))
    quantum = data.draw(st.integers(len(weights), 200))
    with tempfile.TemporaryDirectory() as tmp:
        comps = [(fake_cache(Path(tmp), f"c{i}", n), w) for i, (n, w) in enumerate(zip(sizes, weights))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = tokshuf.Blend(comps, seed=5, quantum=quantum)
    q, _ = ref_quantise(weights, quantum)
    assert b.quanta == q
    length = 2 * quantum + 3
    ms = np.arange(length).reshape(-1, 1)  # any shape
    ks, es = b.locate_many(ms, single_pass=True)
    assert ks.shape == es.shape == ms.shape
    ref = list(ref_draws(q, length, sizes))
    assert [(int(k), int(e)) for k, e in zip(ks.ravel(), es.ravel())] == [(k, e) for k, e, _ in ref]
    assert [b.locate(m, single_pass=True) for m in range(length)] == [(k, e) for k, e, _ in ref]
    assert b.counts(length).tolist() == ref[-1][2]


def test_blend_describe_and_pickle(tmp_path):
    a = fake_cache(tmp_path, "web", 1000)
    c = fake_cache(tmp_path, "code", 10)
    b = tokshuf.Blend([(a, 7), (str(c), 3)], seed=3)
    assert b.quanta == [45875, 19661] and b.seqlen == 64 and b.dtype == np.uint16
    d = b.describe(num_examples=100_000)
    rows = d.to_dict()["components"]
    assert [r["requested"] for r in rows] == [0.7, 0.3]
    assert rows[0]["achieved"] == 45875 / 65536
    assert sum(r["drawn"] for r in rows) == 100_000
    assert rows[1]["epochs"] == pytest.approx(rows[1]["drawn"] / 10)
    text = str(d)
    assert "0.700000" in text and "code" in text and "single pass" in text
    b2 = pickle.loads(pickle.dumps(b))
    ms = np.arange(0, 10**9, 7919)
    for x, y in zip(b.locate_many(ms), b2.locate_many(ms)):
        assert (x == y).all()
    assert b2.fingerprint == b.fingerprint
    assert tokshuf.Blend([(a, 7), (c, 3)], seed=4).fingerprint != b.fingerprint
    assert tokshuf.Blend([(a, 6), (c, 3)], seed=3).fingerprint != b.fingerprint
    assert tokshuf.Blend({a: 0.7, c: 0.3}, seed=3).fingerprint == b.fingerprint


def test_tiny_weight_is_raised_with_a_warning(tmp_path):
    comps = [(fake_cache(tmp_path, "big", 5), 1.0), (fake_cache(tmp_path, "tiny", 5), 1e-9)]
    with pytest.warns(UserWarning, match="tiny"):
        b = tokshuf.Blend(comps, quantum=1024)
    assert b.quanta == [1023, 1] and b.raised == [1]
    assert "*" in str(b.describe())


def test_cache_object_is_accepted(tmp_path):
    a, c = fake_cache(tmp_path, "a", 3), fake_cache(tmp_path, "c", 4)
    cache = tokshuf.Cache(a)
    b = tokshuf.Blend([(cache, 1), (c, 1)])
    assert b.components[0].cache is cache and b.components[0].path == a and b.sizes.tolist() == [3, 4]
    with pytest.warns(UserWarning, match="listed twice"):
        tokshuf.Blend([(cache, 1), (c, 1), (str(a), 2)])


def test_real_cache(small_corpus, tmp_path):
    out = tmp_path / "cache"
    tokshuf.build_cache(small_corpus, out, seqlen=32, chunk_size=16, threads=1, progress=False)
    meta = json.loads((out / "tokshuf.json").read_text())
    same = {k: meta[k] for k in ("seqlen", "dtype", "tokenizer", "eot_id", "pad_id")}
    other = fake_cache(tmp_path, "other", 5, **same)
    b = tokshuf.Blend([(out, 1), (other, 1)])
    assert b.sizes.tolist() == [meta["num_contexts"], 5] and b.eot_id == meta["eot_id"] == 50256
    other_tok = {**meta["tokenizer"], "sha256": "00" * 32, "spec": "other.json"}
    wrong = fake_cache(tmp_path, "wrong_tok", 5, **{**same, "tokenizer": other_tok})
    with pytest.raises(tokshuf.ConfigError, match=r"tokenizer.*other.json"):
        tokshuf.Blend([(out, 1), (wrong, 1)])


@pytest.mark.parametrize(
    "bad, match",
    [
        ([], "at least one"),
        ("w0", "finite and > 0"),
        ("w-1", "finite and > 0"),
        ("wnan", "finite and > 0"),
        ("winf", "finite and > 0"),
        ("whuge", "too large for a float"),
        ("wstr", "must be a number"),
        ("wbool", "must be a number"),
        ("seqlen", "seqlen 64 vs 128"),
        ("tokenizer", "tokenizer 'tiktoken:r50k_base' vs 'x.json'"),
        ("dtype", "dtype uint16 vs uint32"),
        ("eot", "eot_id 0 vs 7"),
        ("empty", "no examples"),
        ("quantum", "smaller than the number of caches"),
        ("pair", "pair"),
        ("object", "cache or a cache path"),
    ],
)
def test_config_errors(tmp_path, bad, match):
    a = fake_cache(tmp_path, "a", 10)
    weights = {
        "w0": 0,
        "w-1": -1.0,
        "wnan": float("nan"),
        "winf": float("inf"),
        "whuge": 10**400,
        "wstr": "1",
        "wbool": True,
    }
    kwargs = {}
    if bad == []:
        comps = []
    elif bad in weights:
        comps = [(a, 1.0), (fake_cache(tmp_path, "b", 10), weights[bad])]
    elif bad == "seqlen":
        comps = [(a, 1), (fake_cache(tmp_path, "b", 10, seqlen=128), 1)]
    elif bad == "tokenizer":
        comps = [(a, 1), (fake_cache(tmp_path, "b", 10, tokenizer={**TOK, "sha256": "cd" * 32, "spec": "x.json"}), 1)]
    elif bad == "dtype":
        comps = [(a, 1), (fake_cache(tmp_path, "b", 10, dtype="uint32"), 1)]
    elif bad == "eot":
        comps = [(fake_cache(tmp_path, "b", 10, eot_id=0), 1), (fake_cache(tmp_path, "c", 10, eot_id=7), 1)]
    elif bad == "empty":
        comps = [(a, 1), (fake_cache(tmp_path, "b", 0), 1)]
    elif bad == "quantum":
        comps = [(a, 1), (fake_cache(tmp_path, "b", 1), 1), (fake_cache(tmp_path, "c", 1), 1)]
        kwargs = {"quantum": 2}
    elif bad == "pair":
        comps = [(a, 1, 2)]
    else:
        comps = [(object(), 1)]
    with pytest.raises(tokshuf.ConfigError, match=match):
        tokshuf.Blend(comps, **kwargs)


def test_cache_errors(tmp_path):
    # Components are opened as tokshuf.Cache, which checks them (test_reader.py has the rest).
    with pytest.raises(tokshuf.InputNotFoundError, match="missing: no such cache folder"):
        tokshuf.Blend([(tmp_path / "missing", 1)])
    building = fake_cache(tmp_path, "building", 10, status="building")
    with pytest.raises(tokshuf.CacheCorruptError, match=r"building.*not finished"):
        tokshuf.Blend([(building, 1)])
    broken = fake_cache(tmp_path, "broken", 3)
    (broken / "shard_00000000.tar").unlink()  # (a short shard is caught on its first read)
    with pytest.raises(tokshuf.CacheCorruptError, match=r"broken/shard_00000000.tar"):
        tokshuf.Blend([(broken, 1)])
    ok = fake_cache(tmp_path, "ok", 4)
    for q in (0, 2**70, 1.5):
        with pytest.raises(tokshuf.ConfigError, match="quantum"):
            tokshuf.Blend([(ok, 1)], quantum=q)
    b = tokshuf.Blend([(ok, 1)])
    for bad in (-1, 2**64, 1.5):
        with pytest.raises(tokshuf.ConfigError):
            b.locate(bad)
    with pytest.raises(tokshuf.ConfigError):
        b.locate_many(np.array([0, -3]))
    with pytest.raises(tokshuf.ConfigError):
        b.locate_many(np.array([0.5]))
    with pytest.raises(tokshuf.ConfigError):
        BlendSchedule([1.0, 2.0], 2**31)
    s = BlendSchedule([1.0, 1000.0], 1024)
    with pytest.raises(tokshuf.ConfigError, match="not in a blend"):
        s.position(2, 0)
    with pytest.raises(tokshuf.ConfigError, match="beyond"):
        s.position(0, 2**64 - 1)


# ---------------------------------------------------------------------------------------------
# Command line.


def test_parse_blend_spec():
    assert parse_blend_spec("web:0.7") == ("web", 0.7)
    assert parse_blend_spec("s3:/a:b/c:3") == ("s3:/a:b/c", 3.0)
    for bad in ("web", ":1", "web:", "web:x", "web:0", "web:-2", "web:nan", "web:inf"):
        with pytest.raises(Exception, match=r"PATH:WEIGHT|weight"):
            parse_blend_spec(bad)


def test_blend_arguments(tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    add_blend_arguments(p)
    assert blend_from_args(p.parse_args([])) is None
    a, c = fake_cache(tmp_path, "a", 5), fake_cache(tmp_path, "c", 5)
    args = p.parse_args(["--blend", f"{a}:3", "--blend", f"{c}:1", "--blend-quantum", "8"])
    b = blend_from_args(args, seed=2)
    assert b.quanta == [6, 2] and b.seed == 2
    with pytest.raises(SystemExit):
        p.parse_args(["--blend", "nocolon"])
    # Without a blend it applies to nothing: it was accepted and ignored.
    with pytest.raises(tokshuf.ConfigError, match="--blend-quantum applies to a blend"):
        blend_from_args(p.parse_args(["--blend-quantum", "0"]))


def test_blend_subcommand(tmp_path, capsys):
    from tokshuf.__main__ import main

    a, c = fake_cache(tmp_path, "a", 5), fake_cache(tmp_path, "c", 5)
    assert main(["blend", f"{a}:3", f"{c}:1", "--num-examples", "100"]) == 0
    out = capsys.readouterr().out
    assert "0.750000" in out and "epochs" in out
    assert main(["blend", f"{a}:3", f"{c}:1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["components"][1]["quanta"] == 16384
    assert main(["blend", f"{a}:1", f"{tmp_path / 'none'}:1"]) == 1
    assert "no such cache folder" in capsys.readouterr().err
