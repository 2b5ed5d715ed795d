"""CLI: ``tokshuf read`` (batch checksums, to compare runs) and ``tokshuf inspect``."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from typing import Any, Dict, Optional

from ._cli_blend import add_blend_arguments, blend_from_args
from ._cli_types import count


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "read",
        help="read batches of a cache (or a blend of caches) and print one checksum per batch",
        description="Read this rank's slice of each global batch and print its sha256 (of the "
        "int64 ids), so runs, ranks and world sizes can be compared.",
    )
    p.add_argument("cache", nargs="?", help="cache folder or URL (or give --blend instead)")
    add_blend_arguments(p)
    p.add_argument("--rank", type=int, default=0, help="this reader's rank, 0 <= RANK < WORLD_SIZE (default 0)")
    p.add_argument("--world-size", type=int, default=1, help="number of readers sharing each global batch (default 1)")
    p.add_argument("--batch-size", type=int, required=True, help="global batch size (examples)")
    p.add_argument("--steps", type=int, default=10, help="batches to read (default 10)")
    p.add_argument("--start-step", type=int, default=0, help="first global batch to read (O(1) seek; default 0)")
    p.add_argument(
        "--ideal-readers",
        type=int,
        default=None,
        help="R* (default: the cache's; for a blend the smallest of its caches')",
    )
    p.add_argument("--seed", type=int, default=0, help="order seed for epochs >= 1 (also of a blend's caches)")
    p.add_argument(
        "--no-reshuffle",
        dest="reshuffle",
        action="store_false",
        help="repeat epoch 0's order instead of reshuffling later epochs",
    )
    p.add_argument("--single-pass", action="store_true", help="each context once, manifest order")
    p.add_argument(
        "--global",
        dest="global_",
        action="store_true",
        help="read the slices of all --world-size ranks and checksum each whole global "
        "batch (reassembled in example order): the same for every world size",
    )
    p.set_defaults(func=_cmd_read)

    q = sub.add_parser(
        "inspect",
        help="print a cache's metadata, its length histogram, and decode its first contexts",
        description="Print a cache's tokshuf.json summary, a histogram of the lengths of its documents "
        "(for an unpacked cache: of every example, and the counts of each length bin), and its first "
        "contexts decoded back to text.",
    )
    q.add_argument("cache", help="cache folder or URL")
    q.add_argument("--contexts", "-n", type=count, default=2, help="contexts to decode (default 2)")
    q.add_argument("--chars", type=count, default=300, help="characters of text shown per context")
    q.add_argument(
        "--sample",
        type=count,
        default=1000,
        help="packed caches: contexts (manifest order) whose documents make the length histogram (default 1000)",
    )
    q.add_argument(
        "--tokenizer",
        default=None,
        help="decode with this tokenizer (default: the one tokshuf.json names, if it is found with the sha256 recorded)",
    )
    q.set_defaults(func=_cmd_inspect)


def _cmd_read(args: argparse.Namespace) -> int:
    import numpy as np

    from ._reader import Reader
    from .exceptions import ConfigError

    for name in ("steps", "start_step"):
        if not 0 <= getattr(args, name) <= sys.maxsize:
            raise ConfigError(f"--{name.replace('_', '-')} must be in [0, {sys.maxsize}], not {getattr(args, name)}")
    blend = blend_from_args(args, seed=args.seed)
    if (blend is None) == (args.cache is None):
        raise ConfigError("read: give either a cache folder or --blend PATH:WEIGHT ... (exactly one of them)")
    source = blend if blend is not None else args.cache
    world = args.world_size
    ranks = range(world) if args.global_ else [args.rank]
    readers = [
        Reader(
            source,
            batch_size=args.batch_size,
            rank=r,
            world_size=world,
            ideal_readers=args.ideal_readers,
            seed=args.seed,
            reshuffle=args.reshuffle,
            single_pass=args.single_pass,
            start_step=args.start_step,
            dtype="int64",
        )
        for r in ranks
    ]
    reader = readers[0]
    what = f"blend of {blend.num_components} caches" if blend is not None else args.cache
    who = f"all {world} ranks (global batches)" if args.global_ else f"rank {args.rank}/{world}"
    print(
        f"# {what}: {who}, batch {args.batch_size}, R* {reader.ideal_readers}, "
        f"seed {args.seed}, fingerprint {reader.fingerprint[:16]}"
    )
    total = hashlib.sha256()
    for n, slices in enumerate(itertools.islice(zip(*readers), args.steps)):
        # An unpacked cache's batches: the padded ids (one width on every rank).
        slices = tuple(getattr(x, "tokens", x) for x in slices)
        batch = slices[0]
        if args.global_:
            # Rank r holds examples first + r + j*world: interleave the slices back in order.
            batch = np.empty((sum(len(x) for x in slices), slices[0].shape[1]), dtype=np.int64)
            for r, x in enumerate(slices):
                batch[r::world] = x
        digest = hashlib.sha256(np.ascontiguousarray(batch, dtype="<i8").tobytes()).hexdigest()
        total.update(digest.encode())
        print(f"step {args.start_step + n}\trows {batch.shape[0]}\tsha256 {digest[:16]}")
    print(f"# all\tsha256 {total.hexdigest()[:16]}")
    return 0


def _short(value: Any, limit: int = 100) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cmd_inspect(args: argparse.Namespace) -> int:
    import numpy as np

    from ._cache import Cache
    from ._unpacked import UnpackedCache, is_unpacked
    from .exceptions import TokshufError

    cache: Any = UnpackedCache(args.cache) if is_unpacked(args.cache) else Cache(args.cache)
    meta = cache.metadata
    print(f"{cache.path}")
    for key in (
        "status",
        "format_version",
        "tokshuf_version",
        "format",
        "dtype",
        "seqlen",
        "chunk_size",
        "num_chunks",
        "num_contexts",
        "num_documents",
        "num_tokens",
        "num_padding_tokens",
        "packing",
        "seed",
        "shuffle",
        "tail",
        "eot_id",
        "pad_id",
        "bos_id",
    ):
        if key in meta:
            print(f"  {key:<20}{_short(meta[key])}")
    tok = meta.get("tokenizer", {})
    print(f"  {'tokenizer':<20}{tok.get('spec')} (vocab {tok.get('vocab_size')}, sha256 {str(tok.get('sha256'))[:16]})")
    print(f"  {'inputs':<20}{len(meta.get('inputs', []))} files, {meta.get('bytes_in', 0):,} bytes")
    print(
        f"  {'ideal_readers':<20}{cache.ideal_readers}"
        + (
            ""
            if "ideal_readers" in meta
            else f" (default: min(64, chunks{' of the largest bin' if isinstance(cache, UnpackedCache) else ''}))"
        )
    )
    print(f"  {'fingerprint':<20}{cache.fingerprint}")
    if isinstance(cache, UnpackedCache):
        _print_bins(cache)
        lengths = np.concatenate([cache.lengths(k) for k in range(len(cache.bins))])
        print(_histogram(lengths, cache.seqlen, "example lengths (ids, with BOS/EOT), every example"))
    else:
        n = min(args.sample, len(cache))
        lengths = _segment_lengths(cache, n)
        what = "every" if n == len(cache) else f"the first {n:,} of {len(cache):,}"
        print(_histogram(lengths, cache.seqlen, f"document lengths inside contexts (ids), {what} contexts"))
    decoder = _decoder(tok, args.tokenizer)
    for i in range(min(args.contexts, len(cache))):
        ids = [int(x) for x in (_nth_example(cache, i) if isinstance(cache, UnpackedCache) else cache[i])]
        print(f"--- context {i}: {ids[:12]}{' ...' if len(ids) > 12 else ''}")
        if decoder is not None:
            try:
                text = decoder.decode(ids)
            except TokshufError as e:
                print(f"  (cannot decode: {e})")
                decoder = None
                continue
            print(text[: args.chars] + (" [...]" if len(text) > args.chars else ""))
    return 0


def _decoder(recorded: Dict[str, Any], given: Optional[str]) -> Any:
    """The tokenizer to decode with, or None (said why). tokshuf.json names it as the build was
    given it, so a relative path or a file changed since may load another one: only one with
    the recorded sha256 decodes, unless the user names one."""
    from ._core import Tokenizer
    from .exceptions import TokshufError

    spec = given or recorded.get("spec")
    try:
        decoder = Tokenizer(str(spec))
    except TokshufError as e:
        print(f"  (cannot load tokenizer to decode: {e}; pass --tokenizer)")
        return None
    if decoder.sha256 != recorded.get("sha256"):
        if given is None:
            print(
                f"  (not decoding: {spec} is not the tokenizer the cache was built with (sha256 "
                f"{decoder.sha256[:16]}, recorded {str(recorded.get('sha256'))[:16]}); pass --tokenizer)"
            )
            return None
        print(f"  (decoding with {spec}, not the tokenizer the cache was built with: sha256 {decoder.sha256[:16]})")
    return decoder


def _print_bins(cache: Any) -> None:
    bins = cache.bins
    total = max(1, sum(b["num_examples"] for b in bins))
    print(f"  {'bins':<20}{len(bins)} length bins (sub-caches bin_KK/)")
    print(f"    {'bin':<5}{'lengths':>13}{'examples':>12}{'share':>8}{'tokens':>15}{'chunks':>8}")
    lo = 0
    for k, b in enumerate(bins):
        span = f"{lo + 1}..{b['max_len']}"
        share = b["num_examples"] / total
        print(f"    {k:<5}{span:>13}{b['num_examples']:>12,}{share:>8.1%}{b['num_tokens']:>15,}{b['num_chunks']:>8,}")
        lo = b["max_len"]


def _nth_example(cache: Any, i: int) -> Any:
    """Example i counting through the bins in order, each in manifest order."""
    for k, sizes in enumerate(cache.chunk_sizes):
        for c, n in enumerate(sizes):
            if i < n:
                return cache.example(k, c, i)
            i -= n
    raise IndexError(i)


def _segment_lengths(cache: Any, n: int) -> Any:
    """Lengths of the documents (pieces between EOTs, padding left out) in the first n contexts."""
    import numpy as np

    from ._boundaries import document_boundaries

    meta = cache.metadata
    out = []
    for start in range(0, n, 256):
        batch = cache.get_batch(range(start, min(n, start + 256)), dtype="int64")
        seg = document_boundaries(batch, eot_id=meta["eot_id"], pad_id=meta.get("pad_id"), layout="segment_ids")
        for row in seg:
            row = row[row >= 0]
            out.append(np.bincount(row))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def _histogram(lengths: Any, seqlen: int, title: str, width: int = 40) -> str:
    """Counts of lengths in power-of-two buckets [2^j, 2^(j+1)), the last one ending at seqlen."""
    import numpy as np

    lines = [f"  {title}: {len(lengths):,}"]
    if len(lengths) == 0:
        return lines[0]
    edges = [1]
    while edges[-1] * 2 <= seqlen:
        edges.append(edges[-1] * 2)
    edges.append(seqlen + 1)
    counts, _ = np.histogram(lengths, bins=edges)
    top = max(1, int(counts.max()))
    for lo, hi, c in zip(edges, edges[1:], counts.tolist()):
        lines.append(f"    {lo:>7}..{hi - 1:<7}{c:>10,}  {'#' * round(width * c / top)}")
    q = np.percentile(lengths, [10, 50, 90])
    lines.append(f"    mean {float(np.mean(lengths)):,.1f}, p10 {q[0]:,.0f}, median {q[1]:,.0f}, p90 {q[2]:,.0f}")
    return "\n".join(lines)
