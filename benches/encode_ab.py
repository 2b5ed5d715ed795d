"""Is a change to the tokenizer faster? Two builds of the `encode_speed` example, A (before) and
B (after), encode the same file in turn, and the per-pair ratio B/A is reported with a 95%
interval: on a shared VM one run of each moves by 20% or more, so a difference of a few
percent shows only over many pairs taken close together.

    export CARGO_TARGET_DIR=...   # the examples land in $CARGO_TARGET_DIR/release/examples
    cargo build --release -p tokshuf-core --example encode_speed && cp .../encode_speed /tmp/es_a
    # change the code, build again, copy to /tmp/es_b
    python -m benches.encode_ab /tmp/es_a /tmp/es_b --spec tiktoken:cl100k_base --input FILE.jsonl

Each run encodes the file `--rounds` times on one thread, memos cold every round, and counts
the median round's MB per CPU-second; A and B take turns, the first of each pair alternating.
The interval is the geometric mean of the ratios +- two standard errors of their logarithms.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
from typing import List

ROUND = re.compile(r"= ([0-9.]+) MB/s \(cpu\)")


def speed(binary: str, spec: str, path: str, rounds: int) -> float:
    """MB of text per CPU-second, the median of one run's rounds."""
    out = subprocess.run([binary, spec, path, str(rounds)], check=True, capture_output=True, text=True).stdout
    speeds = [float(m.group(1)) for m in ROUND.finditer(out)]
    if len(speeds) != rounds:
        raise SystemExit(f"{binary}: expected {rounds} rounds in its output, got:\n{out}")
    return statistics.median(speeds)


def summary(a: List[float], b: List[float]) -> str:
    logs = [math.log(y / x) for x, y in zip(a, b)]
    mean = statistics.fmean(logs)
    half = 2 * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    return (
        f"A {statistics.median(a):.1f} MB/s, B {statistics.median(b):.1f} MB/s (medians); "
        f"B/A {math.exp(mean):.3f}, 95% {math.exp(mean - half):.3f}-{math.exp(mean + half):.3f}, {len(logs)} pairs"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="encode_speed binary before the change")
    ap.add_argument("b", help="encode_speed binary after it")
    ap.add_argument("--spec", default="tiktoken:cl100k_base")
    ap.add_argument("--input", required=True, help="a .jsonl file with a text field")
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    a: List[float] = []
    b: List[float] = []
    for i in range(args.pairs):
        order = [(args.a, a), (args.b, b)] if i % 2 == 0 else [(args.b, b), (args.a, a)]
        for binary, into in order:
            into.append(speed(binary, args.spec, args.input, args.rounds))
    print(summary(a, b))


if __name__ == "__main__":
    main()
