"""Test helpers for the reader: synthetic caches of any chunk sizes, and a pure-Python reference
of the global order (DESIGN §6 with the short-chunk rule documented in order.rs)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .hashref import DOMAIN_CHUNK_PERM, DOMAIN_CONTEXT_PERM, Permutation, combine, mix64  # noqa: F401

# Every member format (docs/format.md §3).
FORMATS = ["npy", "json.gz", "blocks", "blocks.zst"]


# ---- the order, straight from its definition -----------------------------------------------
def chunk_order(sizes: Sequence[int], cs: int, epoch: int, seed: int, reshuffle: bool) -> List[int]:
    """π_e as a list: chunk at each position. Full chunks are permuted among full positions."""
    n = len(sizes)
    if epoch == 0 or not reshuffle:
        return list(range(n))
    full = [c for c in range(n) if sizes[c] == cs]
    perm = Permutation(len(full), combine(combine(DOMAIN_CHUNK_PERM, seed), epoch))
    out = list(range(n))
    for rank, q in enumerate(full):
        out[q] = full[perm.apply(rank)]
    return out


DOMAIN_BLOCKS = 0x626C6F636B73
DOMAIN_ROWS = 0x726F7773


def context_order(size: int, chunk: int, epoch: int, seed: int, reshuffle: bool, block: int = 1) -> List[int]:
    """σ_{e,c} as a list. With ``block`` > 1 (blocks.zst caches) full blocks are permuted
    among themselves and contexts within each block; a short last block stays last."""
    if epoch == 0 or not reshuffle:
        return list(range(size))
    key = combine(combine(combine(DOMAIN_CONTEXT_PERM, seed), epoch), chunk)
    if block == 1:
        perm = Permutation(size, key)
        return [perm.apply(j) for j in range(size)]
    full = size // block
    blocks = Permutation(full, combine(key, DOMAIN_BLOCKS))
    out = []
    for j in range(size):
        b, r = divmod(j, block)
        to = blocks.apply(b) if b < full else b
        rows = block if b < full else size - full * block
        out.append(to * block + Permutation(rows, combine(combine(key, DOMAIN_ROWS), to)).apply(r))
    return out


def reference_examples(
    sizes: Sequence[int], cs: int, r_star: int, seed: int, reshuffle: bool, count: int, block: int = 1
) -> List[Tuple[int, int]]:
    """example[i] = chunk_examples[i mod R*][i div R*] for i < count, as (chunk, index)."""
    n = len(sizes)
    need = count // r_star + 1
    streams: List[List[Tuple[int, int]]] = []
    orders: Dict[int, List[int]] = {}
    for r in range(r_star):
        out: List[Tuple[int, int]] = []
        p = r
        while len(out) < need:
            e, q = divmod(p, n)
            if e not in orders:
                orders[e] = chunk_order(sizes, cs, e, seed, reshuffle)
            c = orders[e][q]
            out.extend((c, j) for j in context_order(sizes[c], c, e, seed, reshuffle, block))
            p += r_star
        streams.append(out)
    return [streams[i % r_star][i // r_star] for i in range(count)]


def reference_example_far(
    sizes: Sequence[int], cs: int, r_star: int, seed: int, reshuffle: bool, i: int
) -> Tuple[int, int]:
    """example[i] for huge i: stream r's positions repeat with period N/gcd(N, R*), so skip
    whole periods, then walk (O(N) per call; a second, independent route to the same answer)."""
    import math

    n = len(sizes)
    r, k = i % r_star, i // r_star
    period = n // math.gcd(n, r_star)
    per_period = sum(sizes[(r + t * r_star) % n] for t in range(period))
    whole, k = divmod(k, per_period)
    t = whole * period
    while True:
        q = (r + t * r_star) % n
        if k < sizes[q]:
            break
        k -= sizes[q]
        t += 1
    p = r + t * r_star
    e, q = divmod(p, n)
    c = chunk_order(sizes, cs, e, seed, reshuffle)[q]
    return c, context_order(sizes[c], c, e, seed, reshuffle)[k]


# ---- synthetic caches ----------------------------------------------------------------------
def npy_header(descr: str, seqlen: int, rows: Optional[int] = None) -> bytes:
    shape = f"({seqlen},)" if rows is None else f"({rows}, {seqlen})"
    d = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    total = -(-(10 + len(d) + 1) // 64) * 64
    body = d.encode() + b" " * (total - 10 - len(d) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + (total - 10).to_bytes(2, "little") + body


def _member(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = len(data), 0, 0o644, 0, 0
    header = info.tobuf(format=tarfile.USTAR_FORMAT)
    return header + data + b"\0" * (-len(data) % 512)


def context_ids(chunk: int, index: int, seqlen: int, tag: Optional[int] = None) -> np.ndarray:
    """Ids of synthetic context (chunk, index): its own address first (then `tag`, if given:
    which cache of a blend it is), then a pattern."""
    ids = np.arange(seqlen, dtype=np.uint32) + chunk * 7 + index * 13
    ids[0], ids[1] = chunk, index
    if tag is not None:
        ids[2] = tag
    return ids


def write_cache(
    root: Path,
    sizes: Sequence[int],
    chunk_size: int,
    seqlen: int = 8,
    fmt: str = "npy",
    extra: Optional[dict] = None,
    tag: Optional[int] = None,
    dtype: str = "uint32",
    block_size: int = 3,
) -> Path:
    """A cache in the exact tokshuf layout whose context (c, i) holds `context_ids(c, i, tag)`
    (ids modulo 2^16 for dtype uint16). ``fmt``: npy, json.gz, blocks or blocks.zst (members of
    ``block_size`` contexts), written here independently of the core's writer."""
    import gzip

    import zstandard

    root.mkdir(parents=True, exist_ok=True)
    descr = {"uint32": "<u4", "uint16": "<u2"}[dtype]
    header = npy_header(descr, seqlen)
    lines = []
    for c, n in enumerate(sizes):
        buf = io.BytesIO()
        if fmt.startswith("blocks"):
            for b, start in enumerate(range(0, n, block_size)):
                rows = np.stack([context_ids(c, i, seqlen, tag) for i in range(start, min(n, start + block_size))])
                payload = npy_header(descr, seqlen, len(rows)) + rows.astype(descr).tobytes()
                if fmt == "blocks.zst":
                    z = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
                    payload = z.compress(payload)
                buf.write(_member(f"{c:08}_{b:08}.npy" + (".zst" if fmt == "blocks.zst" else ""), payload))
        for i in range(0 if fmt.startswith("blocks") else n):
            ids = context_ids(c, i, seqlen, tag).astype(descr)
            if fmt == "npy":
                buf.write(_member(f"{c:08}_{i:08}.npy", header + ids.tobytes()))
            else:
                payload = gzip.compress(json.dumps([int(x) for x in ids], separators=(",", ":")).encode(), mtime=0)
                buf.write(_member(f"{c:08}_{i:08}.json.gz", payload))
        buf.write(b"\0" * 1024)
        data = buf.getvalue()
        (root / f"shard_{c:08}.tar").write_bytes(data)
        lines.append(
            {"shard": f"shard_{c:08}", "num_sequences": n, "num_tokens": n * seqlen, "bytes": len(data), "sha256": ""}
        )
    (root / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    meta = {
        "format_version": 1,
        "status": "complete",
        "seqlen": seqlen,
        "dtype": dtype,
        "format": fmt,
        "chunk_size": chunk_size,
        "num_chunks": len(sizes),
        "num_contexts": sum(sizes),
        "shuffle": False,
        "chunk_sizes": list(sizes),
        "recipe": {"synthetic": True, "sizes": list(sizes)},
    }
    if fmt.startswith("blocks"):
        meta["block_size"] = block_size
    meta.update(extra or {})
    (root / "tokshuf.json").write_text(json.dumps(meta))
    return root


def addresses(batch: np.ndarray) -> List[Tuple[int, int]]:
    """(chunk, index) of each row of a batch of a synthetic cache."""
    return [(int(row[0]), int(row[1])) for row in batch]


def tagged_addresses(batch: np.ndarray) -> List[Tuple[int, int, int]]:
    """(tag, chunk, index) of each row of a batch of tagged synthetic caches (a blend)."""
    return [(int(row[2]), int(row[0]), int(row[1])) for row in batch]
