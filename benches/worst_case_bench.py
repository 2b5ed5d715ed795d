"""Worst-case documents: how long one 1 MB document takes to tokenize (median of runs).

Cases: one character repeated (one 1 MB BPE piece), long runs of spaces / newlines / mixed
whitespace, punctuation. tokshuf's ``Tokenizer.encode`` against the Python reference where
the reference finishes (tiktoken panics on whitespace runs of a million characters or more:
its regex engine's backtracking stack overflows). The growth column is the time of the document
over that of one ``--growth`` times shorter: about that factor for linear work (long pieces are
merged in O(n log n), and each step costs more once their state outgrows the CPU caches), its
square for a quadratic merge.

    python -m benches.worst_case_bench [--size 1000000] [--runs 3] [--growth 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["RUST_BACKTRACE"] = "0"  # tiktoken's panics print a backtrace otherwise
ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "'a' x N": lambda n: "a" * n,
    "x + N spaces + y": lambda n: "x" + " " * n + "y",
    "x + N newlines + y": lambda n: "x" + "\n" * n + "y",
    "' \\t\\n' x N/3": lambda n: " \t\n" * (n // 3),
    "code, 4000-space indents": lambda n: ("def f():\n" + " " * 4000 + "return 1\n") * (n // 4018),
    "'/' x N": lambda n: "/" * n,
    "'中' x N/3": lambda n: "中" * (n // 3),
}
SPECS = {
    "neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"),
    "r50k": "tiktoken:r50k_base",
    "cl100k": "tiktoken:cl100k_base",
    "o200k": "tiktoken:o200k_base",
}


def timed(fn, runs: int):
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=1_000_000, help="characters per document (default 1,000,000)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--growth", type=int, default=16, help="size ratio of the growth column (default 16)")
    p.add_argument("--no-reference", action="store_true")
    args = p.parse_args()

    import tokshuf

    from tests.support import tokref

    print(f"Command: `{' '.join(['python', *sys.argv])}`; load average {os.getloadavg()[0]:.2f}\n")
    print(f"| tokenizer | document | tokshuf s | growth from N/{args.growth} | tokens | reference s |")
    print("|---|---|---:|---:|---:|---:|")
    for name, spec in SPECS.items():
        tok = tokshuf.Tokenizer(spec)
        for case, make in CASES.items():
            text = make(args.size)
            secs, ids = timed(lambda tok=tok, text=text: tok.encode(text), args.runs)
            small = make(args.size // args.growth)
            small_secs, _ = timed(lambda tok=tok, text=small: tok.encode(text), args.runs)
            growth = secs / max(small_secs, 1e-6)
            ref = ""
            if not args.no_reference:
                try:
                    rsecs, rids = timed(
                        lambda spec=spec, text=text: tokref.reference_encode_batch(spec, [text])[0], args.runs
                    )
                    ref = f"{rsecs:.3f}" + ("" if rids == ids else " (ids differ!)")
                except BaseException as e:
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    ref = f"fails: {type(e).__name__}"
            print(f"| {name} | {case} | {secs:.3f} | {growth:.1f}x | {len(ids):,} | {ref} |", flush=True)


if __name__ == "__main__":
    main()
