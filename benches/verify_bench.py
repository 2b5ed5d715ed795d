"""Time `tokshuf.verify` (quick and --full) on a cache built from the real corpus.

    python -m benches.verify_bench [--inputs GLOB] [--cache DIR] [--seqlen N] [--chunk-size N]

Builds the cache once (reused when DIR already holds a complete one), then reports MB/s of
shard data for both modes. Run on a quiet machine; a smoke run on a tiny input:
    python -m benches.verify_bench --inputs 'tests/data/sample/kjv.jsonl' --cache DIR
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time

import tokshuf

from benches.corpus import corpus


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--inputs",
        default=str(corpus("subset100m", "jsonl") / "*"),
        help="glob of input files (default: the corpus subset)",
    )
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "tokshuf-verify-bench"))
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--format", default="npy", choices=["npy", "json.gz"])
    args = ap.parse_args()
    files = sorted(glob.glob(args.inputs))
    if not files:
        raise SystemExit(f"no inputs match {args.inputs}")
    t = time.perf_counter()
    tokshuf.build_cache(
        files, args.cache, seqlen=args.seqlen, chunk_size=args.chunk_size, format=args.format, progress=False
    )
    print(f"build (or reuse): {time.perf_counter() - t:.1f} s")
    with open(os.path.join(args.cache, "tokshuf.json")) as f:
        meta = json.load(f)
    for full in (False, True):
        t = time.perf_counter()
        report = tokshuf.verify(args.cache, full=full)
        secs = time.perf_counter() - t
        assert report.ok, report.summary()
        print(
            f"verify full={full}: {report.num_shards} shards, {report.num_contexts:,} contexts, "
            f"{report.num_bytes / 1e6:,.0f} MB in {secs:.2f} s = {report.num_bytes / 1e6 / secs:,.0f} MB/s "
            f"({meta['format']}, seqlen {meta['seqlen']})"
        )


if __name__ == "__main__":
    main()
