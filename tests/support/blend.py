"""Test helpers for blends: DESIGN §7 written out as plainly as possible, and its composition
with the §6 reference of reader_helpers.py (what a reader over a blend must yield)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .reader import reference_examples, write_cache

TOK = {"spec": "tiktoken:r50k_base", "sha256": "ab" * 32, "vocab_size": 50257, "backend": "tiktoken"}


def ref_quantise(weights: Sequence[float], quantum: int) -> Tuple[List[int], List[int]]:
    """Largest remainder with the documented float formula, then zero shares raised to 1."""
    total = 0.0
    for w in weights:  # left to right, like the core (Python's sum() may compensate)
        total += w
    xs = [(w / total) * quantum for w in weights]
    q = [min(math.floor(x), quantum) for x in xs]
    rem = [x - math.floor(x) for x in xs]
    while sum(q) > quantum:
        q[max(range(len(q)), key=lambda i: (q[i], -i))] -= 1
    order = sorted(range(len(q)), key=lambda i: (-rem[i], i))
    short = quantum - sum(q)
    for t in range(short):
        q[order[t % len(q)]] += 1
    raised = []
    for i in range(len(q)):
        if q[i] == 0:
            q[max(range(len(q)), key=lambda j: (q[j], -j))] -= 1
            q[i] = 1
            raised.append(i)
    return q, raised


def ref_draws(quanta: Sequence[int], length: int, sizes: Optional[Sequence[int]] = None):
    """The greedy loop run for `length` draws (not folded to one period): yields (k, sample)
    and the counts after each draw."""
    d = sum(quanta)
    c = [0] * len(quanta)
    for j in range(length):
        k = 0
        for i in range(1, len(quanta)):
            # argmax of (j+1)*q_i/D - C_i, ties to the lowest i, in exact integers.
            if (j + 1) * quanta[i] - d * c[i] > (j + 1) * quanta[k] - d * c[k]:
                k = i
        sample = c[k] if sizes is None else c[k] % sizes[k]
        c[k] += 1
        yield k, sample, list(c)


Layout = Tuple[Sequence[int], int]  # (chunk sizes, chunk_size) of one cache


def reference_blend(
    layouts: Sequence[Layout],
    weights: Sequence[float],
    quantum: int,
    r_star: int,
    seed: int,
    reshuffle: bool,
    count: int,
) -> List[Tuple[int, int, int]]:
    """(component, chunk, index) of blended examples 0..count: draw k, e from the greedy loop,
    then component k's example[e] from the §6 reference with the same R* and seed."""
    q, _ = ref_quantise(weights, quantum)
    draws = [(k, e) for k, e, _ in ref_draws(q, count)]
    need = [1 + max((e for kk, e in draws if kk == k), default=0) for k in range(len(layouts))]
    own = [reference_examples(sizes, cs, r_star, seed, reshuffle, n) for (sizes, cs), n in zip(layouts, need)]
    return [(k, *own[k][e]) for k, e in draws]


def reference_blend_single_pass(
    layouts: Sequence[Layout], weights: Sequence[float], quantum: int, count: int
) -> List[Tuple[int, int, int]]:
    """The single pass: component k's example e is its context e mod size in manifest order."""
    q, _ = ref_quantise(weights, quantum)
    flat = [[(c, i) for c, n in enumerate(sizes) for i in range(n)] for sizes, _ in layouts]
    return [(k, *flat[k][e]) for k, e, _ in ref_draws(q, count, [len(f) for f in flat])]


def single_pass_length(layouts: Sequence[Layout], weights: Sequence[float], quantum: int) -> int:
    """Shortest prefix of the greedy loop that draws every example of every component."""
    q, _ = ref_quantise(weights, quantum)
    sizes = [sum(s) for s, _ in layouts]
    for m, (_, _, counts) in enumerate(ref_draws(q, 10**9)):
        if all(c >= s for c, s in zip(counts, sizes)):
            return m + 1
    raise AssertionError("unreachable")


def write_blend_caches(root: Path, layouts: Sequence[Layout], fmt: str = "npy") -> List[Path]:
    """One synthetic cache per layout; cache k's contexts carry tag k (see tagged_addresses)."""
    return [
        write_cache(root / f"c{k}", sizes, cs, fmt=fmt, tag=k, extra={"tokenizer": TOK})
        for k, (sizes, cs) in enumerate(layouts)
    ]


def fake_cache(root: Path, name: str, num_contexts: int, seqlen: int = 64, dtype: str = "uint16", **meta) -> Path:
    """A small real cache of one chunk (or none) for blend tests, with a tokenizer entry."""
    extra = {"tokenizer": dict(TOK), **meta}
    sizes = [num_contexts] if num_contexts else []
    return write_cache(root / name, sizes, max(num_contexts, 1), seqlen=seqlen, dtype=dtype, extra=extra)


def manifest_only_cache(root: Path, name: str, num_contexts: int, seqlen: int = 4):
    """A cache of one chunk with tokshuf.json and manifest but no shard, opened without the
    shard check: enough for the schedule (reading a context would fail)."""
    import tokshuf

    d = root / name
    d.mkdir(parents=True)
    meta = {
        "format_version": 1,
        "status": "complete",
        "seqlen": seqlen,
        "dtype": "uint16",
        "format": "npy",
        "chunk_size": num_contexts,
        "num_chunks": 1,
        "num_contexts": num_contexts,
        "recipe": {},
        "tokenizer": TOK,
    }
    (d / "tokshuf.json").write_text(json.dumps(meta))
    (d / "manifest.jsonl").write_text(json.dumps({"shard": "shard_00000000", "num_sequences": num_contexts}) + "\n")
    return tokshuf.Cache(d, check_files=False)
