"""Packing modes side by side: concat, bestfit and none (length bins) on the same files.

For each mode: build time (median of ``--runs`` builds after one warm-up, the modes taking turns
so that drifting machine load hits all alike), the fraction of documents split across examples,
the padding fraction of the stored ids, and the padding fraction of the ids a trainer computes on
at batch size ``--batch-size``. Packed modes store fixed-length contexts, so a trainer computes on
exactly the stored ids. An unpacked cache is read for one epoch's worth of global batches (its
examples divided by the batch size), each padded to its longest example, and compared with
padding every example to ``seqlen``. No assertions: it measures.

    python -m benches.packing_bench --input tests/data/sample
    python -m benches.packing_bench --input $TOKSHUF_CORPUS/subset100m/jsonl --tokenizer neox --seqlen 2049
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import tokshuf

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS = {"neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"), "r50k": "tiktoken:r50k_base"}
MODES = ("concat", "bestfit", "none")


def trainer_padding(path: Path, batch_size: int, pad_to: str) -> Dict[str, float]:
    """Read one epoch's worth of global batches of an unpacked cache: padding fraction of the
    ids computed on, against padding every example to seqlen."""
    cache = tokshuf.UnpackedCache(path)
    steps = max(1, len(cache) // batch_size)
    reader = tokshuf.Reader(cache, batch_size=batch_size, pad_to=pad_to, prefetch=8)
    real = computed = 0
    for _ in range(steps):
        b = next(reader)
        real += b.num_tokens
        computed += b.tokens.size
    reader.close()
    total = sum(b["num_tokens"] for b in cache.bins)
    return {
        "padding": 1 - real / computed,
        "padding_to_seqlen": 1 - total / (len(cache) * cache.seqlen),
    }


def padding_lower_bound(path: Path) -> float:
    """The least padding any packing that keeps whole every document of at most seqlen ids can
    reach: its pieces (the unpacked cache's examples, cut the same way) need at least as many
    contexts as the Martello-Toth L2 bound of bin packing says."""
    import numpy as np

    cache = tokshuf.UnpackedCache(path)
    lens = np.concatenate([cache.lengths(k) for k in range(len(cache.bins))]).astype(np.int64)
    s = cache.seqlen
    best = -(-int(lens.sum()) // s)
    for k in range(0, s // 2 + 1, 8):
        big = lens[lens > s - k]
        mid = lens[(lens > s // 2) & (lens <= s - k)]
        small = int(lens[(lens >= k) & (lens <= s // 2)].sum())
        room = len(mid) * s - int(mid.sum())
        best = max(best, len(big) + len(mid) + max(0, -(-(small - room) // s)))
    return 1 - int(lens.sum()) / (best * s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True, help="input files or folder")
    ap.add_argument("--tokenizer", default="neox", choices=sorted(TOKENIZERS))
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pack-window", type=int, default=None, help="bestfit window (default: the library's)")
    ap.add_argument("--bin-size", type=int, default=128, help="width of the length bins of packing none")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args()
    print(f"# packing_bench: {args.input}, {args.tokenizer}, seqlen {args.seqlen}, load {os.getloadavg()}")
    common = dict(tokenizer=TOKENIZERS[args.tokenizer], seqlen=args.seqlen, threads=args.threads, progress=False)
    extra: Dict[str, Dict[str, Any]] = {
        "concat": {},
        "bestfit": {"packing": "bestfit", "pack_window": args.pack_window},
        "none": {"packing": "none", "bin_size": args.bin_size},
    }
    times: Dict[str, List[float]] = {m: [] for m in MODES}
    meta: Dict[str, Dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs + 1):
            for mode in MODES:
                out = Path(tmp) / f"{mode}{run}"
                t = time.perf_counter()
                stats = tokshuf.build_cache(args.input, out, **common, **extra[mode])
                if run:
                    times[mode].append(time.perf_counter() - t)
                meta[mode] = stats.metadata
                if run < args.runs:
                    shutil.rmtree(out)  # keep the disk footprint to one cache per mode
        last = {m: Path(tmp) / f"{m}{args.runs}" for m in MODES}
        longest = trainer_padding(last["none"], args.batch_size, "longest")
        to_bin = trainer_padding(last["none"], args.batch_size, "bin")
        base = statistics.median(times["concat"])
        docs = meta["concat"]["num_documents"]
        concat_split = meta["bestfit"]["packing_stats"]["concat_documents_split"]
        print(f"documents: {docs:,}; longer than seqlen: {meta['bestfit']['packing_stats']['documents_split']:,}")
        print(
            f"| mode | build s (median of {args.runs}) | vs concat | documents split | padding of stored ids "
            f"| padding computed at batch {args.batch_size} |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for mode in MODES:
            m = meta[mode]
            secs = statistics.median(times[mode])
            split = concat_split if mode == "concat" else m["packing_stats"]["documents_split"]
            if mode == "none":
                stored = 0.0
                computed = (
                    f"{longest['padding']:.2%} (pad to bin bound: {to_bin['padding']:.2%}; "
                    f"every example to seqlen: {longest['padding_to_seqlen']:.2%})"
                )
            else:
                stored = m["num_padding_tokens"] / (m["num_contexts"] * m["seqlen"])
                computed = f"{stored:.2%}"
            print(
                f"| {mode} | {secs:.2f} | {secs / base:.2f}x | {split / docs:.2%} ({split:,}) | {stored:.2%} | {computed} |"
            )
        print(
            f"bestfit: the least padding any whole-document packing can reach here: {padding_lower_bound(last['none']):.2%}"
        )
        ratio = longest["padding"] / longest["padding_to_seqlen"]
        print(f"none: per-batch padding is {ratio:.3f} of padding every example to seqlen (goal <= 0.25)")
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
