"""Packing modes side by side: concat against bestfit on the same files.

For each mode: build time (median of ``--runs`` builds, each in this process after one warm-up),
the fraction of documents split across contexts, and the padding fraction of the stored ids.
No assertions: it measures.

    python -m benches.packing_bench --input tests/data/sample
    python -m benches.packing_bench --input $TOKSHUF_CORPUS/subset100m/jsonl --tokenizer neox --seqlen 2049
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
TOKENIZERS = {"neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"), "r50k": "tiktoken:r50k_base"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="input files or folder")
    ap.add_argument("--tokenizer", default="neox", choices=sorted(TOKENIZERS))
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pack-window", type=int, default=1024)
    args = ap.parse_args()
    print(f"# packing_bench: {args.input}, {args.tokenizer}, seqlen {args.seqlen}, load {os.getloadavg()[0]:.2f}")
    print("| mode | build s (median) | vs concat | documents split | padding of stored ids |")
    print("|---|---:|---:|---:|---:|")
    base = None
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("concat", "bestfit"):
            opts = dict(tokenizer=TOKENIZERS[args.tokenizer], seqlen=args.seqlen, threads=args.threads, progress=False)
            if mode == "bestfit":
                opts.update(packing="bestfit", pack_window=args.pack_window)
            times = []
            for run in range(args.runs + 1):
                t = time.perf_counter()
                stats = tokshuf.build_cache(args.input, Path(tmp) / f"{mode}{run}", **opts)
                if run:
                    times.append(time.perf_counter() - t)
            m = stats.metadata
            secs = statistics.median(times)
            base = base or secs
            pack = m.get("packing_stats") or {}
            split = pack.get("documents_split", None)
            if split is None:  # concat: the documents crossing a context boundary
                split = tokshuf.build_cache(
                    args.input, Path(tmp) / "probe", packing="bestfit", pack_window=args.pack_window, **opts
                ).metadata["packing_stats"]["concat_documents_split"]
            padding = m["num_padding_tokens"] / (m["num_contexts"] * m["seqlen"])
            print(
                f"| {mode} | {secs:.2f} | {secs / base:.2f}x | {split / m['num_documents']:.2%} "
                f"({split:,} of {m['num_documents']:,}) | {padding:.2%} |"
            )


if __name__ == "__main__":
    main()
