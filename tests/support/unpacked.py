"""Test helpers for unpacked caches (docs/format.md §4.2): the bins written out plainly (which
bin each piece of each document goes to, and each bin's §5 order) and the reader's batch
schedule over bins (§7's greedy rule composed with §6 inside a bin)."""

from __future__ import annotations

import bisect
import io
import tarfile
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .blend import ref_draws, ref_quantise
from .hashref import cell_hash, cell_rng, fisher_yates
from .reader import reference_examples

QUANTUM = 1 << 16


def bin_of(length: int, bounds: Sequence[int]) -> int:
    """The first bin whose bound is at least ``length``."""
    return bisect.bisect_left(list(bounds), length)


def reference_bins(
    docs_per_file: Sequence[Sequence[List[int]]], bounds: Sequence[int], seqlen: int, seed: int, cells: int, chunk: int
) -> List[List[List[List[int]]]]:
    """Each bin's chunks of examples: every document cut at ``seqlen``, each piece in its bin
    with id (file, position among the file's pieces of that bin); per bin, §5 with ``cells``
    cells: pieces to cell ``h(seed, id) mod cells``, each cell in id order Fisher-Yates
    shuffled, cells concatenated, cut every ``chunk``."""
    per_bin: List[Dict[Tuple[int, int], List[int]]] = [dict() for _ in bounds]
    for f, docs in enumerate(docs_per_file):
        count = [0] * len(bounds)
        for d in docs:
            for at in range(0, len(d), seqlen):
                piece = d[at : at + seqlen]
                k = bin_of(len(piece), bounds)
                per_bin[k][(f, count[k])] = piece
                count[k] += 1
    out = []
    for pieces in per_bin:
        groups: List[List[Tuple[int, int]]] = [[] for _ in range(cells)]
        for f, p in sorted(pieces):
            groups[cell_hash(seed, f, p) % cells].append((f, p))
        order = [i for c, g in enumerate(groups) for i in fisher_yates(g, cell_rng(seed, c))]
        examples = [pieces[i] for i in order]
        out.append([examples[i : i + chunk] for i in range(0, len(examples), chunk)])
    return out


def reference_schedule(counts: Sequence[int], batches: int) -> List[Tuple[int, int]]:
    """(bin, the bin's own batch counter) of global batches 0..batches: §7's greedy rule over
    the non-empty bins with their example counts as weights."""
    drawn = [k for k, n in enumerate(counts) if n]
    q, _ = ref_quantise([float(counts[k]) for k in drawn], QUANTUM)
    out = []
    for k, c, _ in ref_draws(q, batches):
        out.append((drawn[k], c))
    return out


def reference_batch(
    cache, counts: Sequence[int], b: int, batch_size: int, r_star: int, seed: int, reshuffle: bool = True
) -> Tuple[int, List[np.ndarray]]:
    """(bin, examples) of global batch ``b``: the bin's examples [beta B, (beta+1) B) of its §6
    order (``cache`` is a tokshuf.UnpackedCache, used only to fetch examples by address)."""
    k, beta = reference_schedule(counts, b + 1)[b]
    sizes = cache.chunk_sizes[k]
    locs = reference_examples(sizes, cache.metadata["chunk_size"], r_star, seed, reshuffle, (beta + 1) * batch_size)
    return k, [cache.example(k, c, i) for c, i in locs[beta * batch_size :]]


def tar_offsets(path: Path) -> List[int]:
    """Where each member's header starts, then where the end-of-archive blocks start (what the
    ``.idx`` sidecar must hold), found by the standard library's tar reader."""
    with tarfile.open(path) as t:
        members = t.getmembers()
    offs = [m.offset for m in members]
    last = members[-1]
    offs.append(last.offset_data + -(-last.size // 512) * 512)
    return offs


def member_arrays(path: Path) -> List[np.ndarray]:
    with tarfile.open(path) as t:
        return [np.load(io.BytesIO(t.extractfile(m).read())) for m in t.getmembers()]  # type: ignore[union-attr]
