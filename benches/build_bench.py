"""End-to-end build throughput against the raw speed of the reference tokenizers.

For each tokenizer (GPT-NeoX-20B tokenizer.json, tiktoken cl100k_base), on the same input
files and the same number of threads, median of ``--runs`` runs, each in its own process:

- ``build``: ``tokshuf.build_cache`` end to end (read, decompress, tokenize, window, shuffle,
  write): MB/s of document text (UTF-8 bytes of the text fields, as tokshuf.json's
  ``text_bytes``), tokens/s, peak RSS of the process (``wait4`` ru_maxrss and tokshuf.json's
  ``build.peak_rss_bytes``) and the time of each stage (``build.durations``).
- ``reference``: the Python reference on the same documents, already in memory, timing only
  the encode calls: HF ``tokenizers`` ``encode_batch_fast(add_special_tokens=False)`` with
  ``encode_special_tokens = True`` for NeoX (threads via ``RAYON_NUM_THREADS``), tiktoken
  ``encode_ordinary_batch(num_threads=N)`` for cl100k.

Writes a markdown table (machine, command, results) to stdout and to ``--out``.

    python benches/build_bench.py                          # subset100m, all cores, 3 runs
    python benches/build_bench.py --input /work/corpus/out/jsonl.zst --threads 2 --runs 5
    python benches/build_bench.py --input /work/corpus/out/subset100m/jsonl/part-00.jsonl --runs 1  # smoke

Run it on a quiet machine: other processes distort every number here.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT_INPUT = "/work/corpus/out/subset100m/jsonl"
TOKENIZERS = {
    "neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"),
    "cl100k": "tiktoken:cl100k_base",
}
REF_BATCH_DOCS = 512  # documents per reference encode call (bounds the memory of HF Encodings)


# --------------------------------------------------------------------------------------
# Children: one measurement each, result as JSON on stdout.


def child_build(args) -> dict:
    import tokshuf

    out = Path(args.workdir) / "cache"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    stats = tokshuf.build_cache(args.input, out, tokenizer=TOKENIZERS[args.tokenizer], threads=args.threads,
                                seqlen=args.seqlen, format=args.format, progress=False)
    wall = time.perf_counter() - t0
    m = stats.metadata
    result = {
        "wall_s": wall,
        "text_bytes": m["text_bytes"],
        "bytes_in": m["bytes_in"],
        "num_tokens": m["num_tokens"],
        "num_documents": m["num_documents"],
        "durations": m["build"]["durations"],
        "total_s": m["build"]["total_s"],
        "peak_rss_bytes": m["build"].get("peak_rss_bytes"),
        "threads": m["build"]["threads"],
        "backend": m["tokenizer"]["backend"],
    }
    shutil.rmtree(out, ignore_errors=True)
    return result


def read_texts(paths: List[str]) -> List[str]:
    from tokshuf._inputs import expand_inputs

    texts = []
    for path in expand_inputs(paths):
        if path.endswith(".gz"):
            f = io.TextIOWrapper(gzip.open(path), encoding="utf-8")
        elif path.endswith((".zst", ".zstd")):
            import zstandard

            f = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
        else:
            f = open(path, encoding="utf-8")
        with f:
            for line in f:
                if line.strip():
                    text = json.loads(line).get("text")
                    if isinstance(text, str) and text:
                        texts.append(text)
    return texts


def child_reference(args) -> dict:
    texts = read_texts(args.input)
    batches = [texts[i:i + REF_BATCH_DOCS] for i in range(0, len(texts), REF_BATCH_DOCS)]
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    tokens, seconds = 0, 0.0
    if args.tokenizer == "neox":
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(TOKENIZERS["neox"])
        tok.encode_special_tokens = True
        tok.encode_batch_fast(batches[0][:8], add_special_tokens=False)  # warm up the thread pool
        for batch in batches:
            t0 = time.perf_counter()
            encs = tok.encode_batch_fast(batch, add_special_tokens=False)
            seconds += time.perf_counter() - t0
            tokens += sum(len(e.ids) for e in encs)
        what = f"tokenizers {tokenizers.__version__} encode_batch_fast"
    else:
        import tiktoken
        import tokref

        enc = tokref.tiktoken_reference("cl100k_base")
        for batch in batches:
            t0 = time.perf_counter()
            ids = enc.encode_ordinary_batch(batch, num_threads=args.threads)
            seconds += time.perf_counter() - t0
            tokens += sum(map(len, ids))
        what = f"tiktoken {tiktoken.__version__} encode_ordinary_batch"
    return {"encode_s": seconds, "text_bytes": text_bytes, "num_tokens": tokens, "num_documents": len(texts),
            "what": what}


# --------------------------------------------------------------------------------------
# Parent: run children, collect medians, write the table.


def run_child(kind: str, args, tokenizer: str) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--tokenizer-one", tokenizer, "--threads", str(args.threads),
           "--seqlen", str(args.seqlen), "--format", args.format, "--workdir", args.workdir, "--input", *args.input]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="true")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} {tokenizer} failed (exit {proc.returncode})")
    result = json.loads(out)
    result["ru_maxrss_bytes"] = usage.ru_maxrss * 1024  # KiB on Linux
    return result


def machine_info() -> Dict[str, str]:
    model = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    versions = {}
    for mod in ("tokshuf", "tokenizers", "tiktoken"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing module is just not reported
            versions[mod] = "?"
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "cpu": model,
        "cores": f"{os.cpu_count()} logical, {len(os.sched_getaffinity(0))} usable",
        "memory": mem,
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "versions": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "commit": commit,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def med(values) -> float:
    return statistics.median(values)


def report(args, results: Dict[str, dict]) -> str:
    info = machine_info()
    lines = [
        "# tokshuf build benchmark",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        f"| threads | {args.threads} (builds and references alike) |",
        f"| input | {', '.join(args.input)} |",
        f"| runs | {args.runs} per measurement, median reported |",
        "",
        "Command: `" + " ".join([Path(sys.executable).name, *sys.argv]) + "`",
        "",
        "| tokenizer | what | MB/s of text | Mtokens/s | vs reference | peak RSS | seconds |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        builds, refs = r["build"], r["reference"]
        b_mbs = med([x["text_bytes"] / 1e6 / x["wall_s"] for x in builds])
        b_tps = med([x["num_tokens"] / 1e6 / x["wall_s"] for x in builds])
        rss = max(x["ru_maxrss_bytes"] for x in builds) / 2**20
        own_rss = max((x["peak_rss_bytes"] or 0) for x in builds) / 2**20
        r_mbs = med([x["text_bytes"] / 1e6 / x["encode_s"] for x in refs]) if refs else float("nan")
        r_tps = med([x["num_tokens"] / 1e6 / x["encode_s"] for x in refs]) if refs else float("nan")
        lines.append(f"| {name} | tokshuf build_cache end to end ({builds[0]['backend']}) | {b_mbs:.2f} | {b_tps:.2f} | "
                     f"{b_mbs / r_mbs:.2f}x | {rss:.0f} MiB (own {own_rss:.0f}) | {med([x['wall_s'] for x in builds]):.2f} |")
        if refs:
            lines.append(f"| {name} | reference: {refs[0]['what']} (encode only) | {r_mbs:.2f} | {r_tps:.2f} | 1.00x | "
                         f"{max(x['ru_maxrss_bytes'] for x in refs) / 2**20:.0f} MiB | "
                         f"{med([x['encode_s'] for x in refs]):.2f} |")
    # Stage times, in the order the build runs them.
    order = {"tokenize_s": 0, "plan_s": 1, "write_s": 2}
    stages = sorted({k for r in results.values() for x in r["build"] for k in x["durations"]},
                    key=lambda k: (order.get(k, 9), k))
    lines += ["", "Stage times of the builds (median seconds, `build.durations` in tokshuf.json):", "",
              "| tokenizer | " + " | ".join(k.removesuffix("_s") for k in stages) + " | total |",
              "|---|" + "---:|" * (len(stages) + 1)]
    for name, r in results.items():
        builds = r["build"]
        cells = [f"{med([x['durations'].get(k, 0.0) for x in builds]):.2f}" for k in stages]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {med([x['total_s'] for x in builds]):.2f} |")
    docs = {name: r["build"][0]["num_documents"] for name, r in results.items()}
    text = {name: r["build"][0]["text_bytes"] for name, r in results.items()}
    lines += ["", f"Documents: {docs}; text bytes: {text}. The reference columns time only the encode calls on "
              "documents already in memory; the build includes reading, JSON parsing, decompression, windowing, "
              "shuffling and writing."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", nargs="+", default=[DEFAULT_INPUT], help="input files or folders (default subset100m)")
    p.add_argument("--tokenizers", default="neox,cl100k", help="comma-separated: neox, cl100k")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seqlen", type=int, default=2049)
    p.add_argument("--format", default="npy")
    p.add_argument("--no-reference", action="store_true", help="only the builds")
    p.add_argument("--workdir", default=None, help="scratch folder for the caches (default: a temp folder)")
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--child", choices=["build", "reference"], help=argparse.SUPPRESS)
    p.add_argument("--tokenizer-one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.tokenizer = args.tokenizer_one
        result = child_build(args) if args.child == "build" else child_reference(args)
        print(json.dumps(result))
        return
    own_tmp = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="tokshuf-bench-")
    try:
        results = {}
        for name in args.tokenizers.split(","):
            results[name] = {"build": [], "reference": []}
            for run in range(args.runs):
                # Alternate build and reference so drifting machine load hits both alike.
                b = run_child("build", args, name)
                results[name]["build"].append(b)
                print(f"[{name} run {run + 1}/{args.runs}] build {b['wall_s']:.2f} s "
                      f"({b['text_bytes'] / 1e6 / b['wall_s']:.2f} MB/s)", file=sys.stderr)
                if not args.no_reference:
                    r = run_child("reference", args, name)
                    results[name]["reference"].append(r)
                    print(f"[{name} run {run + 1}/{args.runs}] reference {r['encode_s']:.2f} s "
                          f"({r['text_bytes'] / 1e6 / r['encode_s']:.2f} MB/s)", file=sys.stderr)
        text = report(args, results)
        print(text)
        if args.out:
            Path(args.out).write_text(text)
    finally:
        if own_tmp:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
