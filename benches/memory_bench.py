"""Peak memory of builds on inputs that press on `memory_limit` (docs/building.md, "Memory"):
one line that is a single pre-token of 16 MiB (one letter, spaces or digits repeated, beside 200
ordinary documents), and best fit over windows of long documents (1,100 of 512 KiB by default),
shuffled and streaming. Each build runs in a fresh process: the table gives its peak RSS, its
seconds, and the first digits of its manifest's sha256 (the same input and recipe must give the
same manifest whatever the limit).

    python -m benches.memory_bench [--memory-limit 64MiB] [--threads 2] [--tokenizers cl100k,neox]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tokshuf._cli_types import parse_size  # noqa: E402

from benches.build_bench import TOKENIZERS, fresh_build  # noqa: E402 (after the path above)
from tests.support.corpus import WORDS, write_jsonl  # noqa: E402

LINE_CHARS = (16 << 20) - 64  # the JSON around it keeps the line under the 16 MiB cap


def ordinary(n: int) -> list:
    return [f"document {i} with some ordinary words in it. " * 50 for i in range(n)]


def make_inputs(workdir: Path, docs: int, doc_kib: int) -> dict:
    """Case name -> (input file, build options)."""
    cases = {}
    for name, ch in [("line of 'a'", "a"), ("line of spaces", " "), ("line of '1'", "1")]:
        path = write_jsonl(workdir / f"line_{ord(ch)}.jsonl", [ch * LINE_CHARS] + ordinary(200))
        cases[name] = (path, {})
    rng = random.Random(7)
    base = " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(2 << 20))
    n = doc_kib << 10
    path = workdir / "long_docs.jsonl"
    write_jsonl(path, (f"doc {i} " + base[(i * 104_729) % (len(base) - n) :][:n] for i in range(docs)))
    cases[f"bestfit, {docs} documents of {doc_kib} KiB, shuffled"] = (path, {"packing": "bestfit"})
    cases[f"bestfit, {docs} documents of {doc_kib} KiB, streaming"] = (path, {"packing": "bestfit", "shuffle": False})
    return cases


def child(args) -> None:
    options = dict(tokenizer=args.tokenizer, threads=args.threads, seqlen=2048, memory_limit=args.memory_limit)
    with fresh_build(args.workdir, args.input, **options, **json.loads(args.options)) as (out, stats, seconds):
        manifest = hashlib.sha256((out / "manifest.jsonl").read_bytes()).hexdigest()[:12]
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's peak, this one's own.
    status = Path("/proc/self/status").read_text()
    peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) * 1024
    print(json.dumps({"seconds": seconds, "peak": peak, "manifest": manifest, "tokens": stats.metadata["num_tokens"]}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--tokenizers", default="cl100k,neox", help=f"comma-separated: {', '.join(TOKENIZERS)} (default cl100k,neox)"
    )
    p.add_argument("--memory-limit", type=parse_size, default=64 << 20, help="bytes, or 64MiB, 1GiB... (default 64MiB)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--docs", type=int, default=1100, help="long documents of the best-fit cases (default 1100)")
    p.add_argument("--doc-kib", type=int, default=512, help="their size in KiB (default 512)")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temp folder, deleted at the end)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--input", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)

    tmp = None if args.workdir else tempfile.TemporaryDirectory()
    workdir = Path(args.workdir or tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        cases = make_inputs(workdir, args.docs, args.doc_kib)
        print(f"memory_limit {args.memory_limit} bytes, {args.threads} threads; peak RSS of each build's process")
        print("| case | tokenizer | peak RSS | seconds | tokens | manifest |\n|---|---|---:|---:|---:|---|")
        for case, (path, options) in cases.items():
            for name in args.tokenizers.split(","):
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    "--input",
                    str(path),
                    "--tokenizer",
                    TOKENIZERS.get(name, name),
                ]
                cmd += [
                    "--threads",
                    str(args.threads),
                    "--memory-limit",
                    str(args.memory_limit),
                    "--workdir",
                    str(workdir),
                ]
                cmd += ["--options", json.dumps(options)]
                r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                print(
                    f"| {case} | {name} | {r['peak'] / 2**20:.0f} MiB | {r['seconds']:.2f} | {r['tokens']:,} | {r['manifest']} |",
                    flush=True,
                )
    finally:
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
