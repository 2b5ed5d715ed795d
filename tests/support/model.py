"""Small pure-Python references of what a build must produce (DESIGN §4-5), written from the
design text and `rust/tokshuf-core/src/hash.rs`, never from the build code's output.

- `model_streams`: documents -> contexts per stream (each input file, then the stitched tails).
- `model_round_robin`: the chunk order of ``shuffle=False``.
- `model_shuffle`: the two-stage shuffle (cells by `cell_hash`, id order, Fisher-Yates with
  `cell_rng` and Lemire's bounded integers, cells concatenated in cell order, cut into chunks).
"""

from __future__ import annotations

from collections import Counter
from typing import List, Sequence

from .hashref import (  # noqa: F401  (re-exported for the tests)
    SplitMix64,
    cell_hash,
    cell_rng,
    combine,
    fisher_yates,
    mix64,
)

# --------------------------------------------------------------------------------------
# Windowing and chunk order


def model_streams(files_docs, encode, seqlen, tail, bos, pad, eot):
    """Contexts of each stream (input files, then the stitched tails) and the counts."""
    streams, tails = [], []
    stats = Counter()
    for docs in files_docs:
        ids = []
        for d in docs:
            if d == "":
                stats["empty_documents"] += 1
                continue
            stats["num_documents"] += 1
            ids += ([bos] if bos is not None else []) + encode(d) + [eot]
        stats["num_tokens"] += len(ids)
        n = len(ids) // seqlen
        contexts = [ids[i * seqlen : (i + 1) * seqlen] for i in range(n)]
        rest = ids[n * seqlen :]
        if tail == "pad" and rest:
            contexts.append(rest + [pad] * (seqlen - len(rest)))
            stats["num_padding_tokens"] += seqlen - len(rest)
        elif tail == "stitch":
            tails += rest
        elif tail == "drop":
            stats["dropped_tokens"] += len(rest)
            stats["num_tokens"] -= len(rest)
        streams.append(contexts)
    if tail == "stitch":
        # The stitched tails are one more stream, with the file index after the last file.
        n = len(tails) // seqlen
        contexts = [tails[i * seqlen : (i + 1) * seqlen] for i in range(n)]
        rest = tails[n * seqlen :]
        if rest:
            contexts.append(rest + [pad] * (seqlen - len(rest)))
            stats["num_padding_tokens"] += seqlen - len(rest)
        streams.append(contexts)
    return streams, stats


def model_round_robin(streams, chunk_size, stitched=False):
    """shuffle=False: chunk c is the (c div K)-th chunk of input file c mod K, exhausted ones
    dropped; the stitched tails (the last stream when ``stitched``) come after every round,
    since they are only known once every file is done and streaming must not wait for them."""
    per_stream = [[s[i : i + chunk_size] for i in range(0, len(s), chunk_size)] for s in streams]
    tail_chunks = per_stream.pop() if stitched else []
    chunks = []
    for j in range(max((len(p) for p in per_stream), default=0)):
        chunks.extend(p[j] for p in per_stream if j < len(p))
    return chunks + tail_chunks


def shuffled_ids(counts: Sequence[int], seed: int, cells: int) -> List[tuple]:
    """Context ids (stream, position) in global shuffled order (DESIGN §5)."""
    buckets: List[list] = [[] for _ in range(cells)]
    for f, n in enumerate(counts):  # id order: (file, position) ascending
        for p in range(n):
            buckets[cell_hash(seed, f, p) % cells].append((f, p))
    order = []
    for c, bucket in enumerate(buckets):
        order.extend(fisher_yates(bucket, cell_rng(seed, c)))
    return order


def model_shuffle(streams, seed: int, cells: int, chunk_size: int):
    """Chunks of contexts of a shuffled cache."""
    order = [streams[f][p] for f, p in shuffled_ids([len(s) for s in streams], seed, cells)]
    return [order[i : i + chunk_size] for i in range(0, len(order), chunk_size)]
