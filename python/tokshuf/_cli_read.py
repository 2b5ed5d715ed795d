"""CLI: ``tokshuf read`` (batch checksums, to compare runs) and ``tokshuf inspect``."""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
from typing import Any

from ._cli_blend import add_blend_arguments, blend_from_args


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
        help="print a cache's metadata and decode its first contexts",
        description="Print a cache's tokshuf.json summary and its first contexts decoded back to text.",
    )
    q.add_argument("cache", help="cache folder or URL")
    q.add_argument("--contexts", "-n", type=int, default=2, help="contexts to decode (default 2)")
    q.add_argument("--chars", type=int, default=300, help="characters of text shown per context")
    q.set_defaults(func=_cmd_inspect)


def _cmd_read(args: argparse.Namespace) -> int:
    import numpy as np

    from ._reader import Reader
    from .exceptions import ConfigError

    for name in ("steps", "start_step"):
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, not {getattr(args, name)}")
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
        batch = slices[0]
        if args.global_:
            # Rank r holds examples first + r + j*world: interleave the slices back in order.
            batch = np.empty((sum(len(x) for x in slices), reader.seqlen), dtype=np.int64)
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
    from ._cache import Cache
    from ._core import Tokenizer
    from .exceptions import TokshufError

    cache = Cache(args.cache)
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
        + ("" if "ideal_readers" in meta else " (default: min(64, chunks))")
    )
    print(f"  {'fingerprint':<20}{cache.fingerprint}")
    try:
        decoder: Any = Tokenizer(tok["spec"])
    except (TokshufError, KeyError) as e:
        decoder = None
        print(f"  (cannot load tokenizer to decode: {e})")
    for i in range(min(args.contexts, len(cache))):
        ids = [int(x) for x in cache[i]]
        print(f"--- context {i}: {ids[:12]}{' ...' if len(ids) > 12 else ''}")
        if decoder is not None:
            text = decoder.decode(ids)
            print(text[: args.chars] + (" [...]" if len(text) > args.chars else ""))
    return 0
