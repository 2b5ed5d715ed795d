"""CLI: ``tokshuf read`` (batch checksums, to compare runs) and ``tokshuf inspect``."""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "read",
        help="read batches of a cache and print one checksum per batch",
        description="Read this rank's slice of each global batch and print its sha256 (of the "
        "int64 ids), so runs, ranks and world sizes can be compared.",
    )
    p.add_argument("cache", help="cache folder")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--batch-size", type=int, required=True, help="global batch size (examples)")
    p.add_argument("--steps", type=int, default=10, help="batches to read (default 10)")
    p.add_argument("--start-step", type=int, default=0)
    p.add_argument("--ideal-readers", type=int, default=None, help="R* (default: the cache's)")
    p.add_argument("--seed", type=int, default=0, help="order seed for epochs >= 1")
    p.add_argument("--no-reshuffle", dest="reshuffle", action="store_false",
                   help="repeat epoch 0's order instead of reshuffling later epochs")
    p.add_argument("--single-pass", action="store_true", help="each context once, manifest order")
    p.add_argument("--global", dest="global_", action="store_true",
                   help="checksum the whole global batch (all ranks' slices, in example order)")
    p.set_defaults(func=_cmd_read)

    q = sub.add_parser("inspect", help="print a cache's metadata and decode its first contexts")
    q.add_argument("cache", help="cache folder")
    q.add_argument("--contexts", "-n", type=int, default=2, help="contexts to decode (default 2)")
    q.add_argument("--chars", type=int, default=300, help="characters of text shown per context")
    q.set_defaults(func=_cmd_inspect)


def _cmd_read(args: argparse.Namespace) -> int:
    import numpy as np

    from ._cache import Cache
    from ._reader import Reader

    cache = Cache(args.cache)
    rank, world = (0, 1) if args.global_ else (args.rank, args.world_size)
    reader = Reader(cache, batch_size=args.batch_size, rank=rank, world_size=world,
                    ideal_readers=args.ideal_readers, seed=args.seed, reshuffle=args.reshuffle,
                    single_pass=args.single_pass, start_step=args.start_step, dtype="int64")
    print(f"# {args.cache}: rank {rank}/{world}, batch {args.batch_size}, R* {reader.ideal_readers}, "
          f"seed {args.seed}, fingerprint {reader.fingerprint[:16]}")
    total = hashlib.sha256()
    for n, batch in enumerate(reader):
        if n >= args.steps:
            break
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
    for key in ("status", "format_version", "tokshuf_version", "format", "dtype", "seqlen", "chunk_size",
                "num_chunks", "num_contexts", "num_documents", "num_tokens", "num_padding_tokens", "seed",
                "shuffle", "tail", "eot_id", "pad_id", "bos_id"):
        if key in meta:
            print(f"  {key:<20}{_short(meta[key])}")
    tok = meta.get("tokenizer", {})
    print(f"  {'tokenizer':<20}{tok.get('spec')} (vocab {tok.get('vocab_size')}, sha256 {str(tok.get('sha256'))[:16]})")
    print(f"  {'inputs':<20}{len(meta.get('inputs', []))} files, {meta.get('bytes_in', 0):,} bytes")
    print(f"  {'ideal_readers':<20}{cache.ideal_readers}" + ("" if "ideal_readers" in meta else " (default: min(64, chunks))"))
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
