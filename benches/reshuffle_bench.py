"""``shuffle_only``: how fast the contexts of existing shards are shuffled into a new cache,
against building the source cache from jsonl.

Builds a source cache per member format from ``--input`` once, then times reshuffles of it
(median of ``--runs``, formats interleaved, each run into a fresh folder in this process). The
figures are contexts per second and MB per second of source shards read. No assertions.

    python -m benches.reshuffle_bench --input tests/data/sample --seqlen 64 --chunk-size 64
    python -m benches.reshuffle_bench --input $TOKSHUF_CORPUS/subset100m/jsonl --chunk-size 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import tokshuf

ROOT = Path(__file__).resolve().parent.parent
NEOX = str(ROOT / "tests" / "data" / "gpt-neox-20b.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="jsonl files or folder the source cache is built from")
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    opts = dict(tokenizer=NEOX, seqlen=args.seqlen, chunk_size=args.chunk_size, threads=args.threads, progress=False)
    print(f"# reshuffle_bench: {args.input}, NeoX, seqlen {args.seqlen}, chunk {args.chunk_size}")
    with tempfile.TemporaryDirectory() as tmp:
        sources, built = {}, {}
        for fmt in ("npy", "json.gz"):
            t = time.perf_counter()
            tokshuf.build_cache(args.input, Path(tmp) / f"src-{fmt}", format=fmt, **opts)
            built[fmt] = time.perf_counter() - t
            sources[fmt] = Path(tmp) / f"src-{fmt}"
        times = {fmt: [] for fmt in sources}
        stats = {}
        for run in range(args.runs):
            for fmt, src in sources.items():
                out = Path(tmp) / f"out-{fmt}-{run}"
                t = time.perf_counter()
                stats[fmt] = tokshuf.build_cache([src], out, shuffle_only=True, format=fmt, seed=run + 1, **opts)
                times[fmt].append(time.perf_counter() - t)
        print(f"load average {os.getloadavg()[0]:.2f}")
        print(
            "| source members | shards | contexts | source build s | reshuffle s (median) | contexts/s | MB/s of shards |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for fmt, src in sources.items():
            secs = statistics.median(times[fmt])
            m = stats[fmt].metadata
            shard_mb = sum(p.stat().st_size for p in src.glob("shard_*.tar")) / 1e6
            print(
                f"| {fmt} | {len(m['inputs'])} | {m['num_contexts']:,} | {built[fmt]:.2f} | {secs:.2f} | "
                f"{m['num_contexts'] / secs:,.0f} | {shard_mb / secs:.1f} |"
            )


if __name__ == "__main__":
    main()
