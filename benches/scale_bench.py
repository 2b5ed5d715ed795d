"""Builds of 0.5 to 5 GB on one machine within a memory limit, against the disk's raw speed.

The input of size k is k copies of the corpus files (``--input``, default
``$TOKSHUF_CORPUS/jsonl``, 532 MB, else the committed sample), copied under new names into a
scratch folder deleted at the end; a build of k copies reads the first k of them. For each size
(``--copies``, default 1,2,4,10: 0.5, 1, 2 and 5 GB) ``--runs`` builds, each in a fresh process,
with ``memory_limit`` (default 1 GiB), the sizes interleaved run by run so that a machine's
drifting load hits them alike; after each build, the disk's raw speed on the same bytes.
Reported per size (medians):

- text MB/s (UTF-8 bytes of the documents, tokshuf.json ``text_bytes``, over the wall time of
  ``build_cache``) and tokens/s: flat from 0.5 to 5 GB is the goal. Beside it, text MB per
  CPU-second of the build process (user + system, ``wait4``), which a busy machine does not
  distort: flat CPU cost per byte means flat throughput wherever the load is steady;
- peak RSS of the build process (``wait4`` ru_maxrss) against the memory limit;
- the stages' times (tokshuf.json ``build.durations``) and stage 2's own figures
  (``build.stage2``: time reading the spills, writing, in fsync, and its CPU time);
- ``raw``: the time to read stage 2's input once and write its output once with plain
  sequential I/O on the same file system: write the shards' bytes (``bytes_out``) to one
  file in 1 MiB blocks and fsync it, then read the spills' bytes (contexts x seqlen x id size)
  back from it. Read right after the write, the file is as warm in the page cache as stage
  1's spills are when stage 2 reads them; the cold read (the file dropped from the page cache
  first) is reported beside it. The ratio is stage 2's time (``write_s``) over ``raw``; the
  goal is at most 1.5.

At most one input and one cache exist at a time (the 5 GB input and its cache need about
12 GB of disk). No assertions: it measures, it does not check.

    python -m benches.scale_bench                              # 0.5, 1, 2, 5 GB, NeoX, 2 threads
    python -m benches.scale_bench --copies 1 --runs 3          # the 532 MB corpus, 3 builds
    python -m benches.scale_bench --smoke                      # ~3 MB x 1, 2: checks the script
    python -m benches.scale_bench --input $TOKSHUF_CORPUS/jsonl.zst --copies 1,10
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benches.build_bench import TOKENIZERS, machine_info
from benches.corpus import corpus

DEFAULT_INPUT = str(corpus("jsonl"))
BLOCK = 1 << 20
SMOKE_BYTES = 3 << 20


def parse_size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30}
    t = text.strip().lower()
    num = t.rstrip("kmgib")
    return int(float(num) * units[t[len(num) :]])


# --------------------------------------------------------------------------------------
# Child: one build, its tokshuf.json figures as JSON on stdout.


def child_build(args) -> dict:
    import tokshuf

    t0 = time.perf_counter()
    stats = tokshuf.build_cache(
        Path(args.input).read_text().split("\n"),
        args.cache,
        tokenizer=TOKENIZERS.get(args.tokenizer, args.tokenizer),
        threads=args.threads,
        seqlen=args.seqlen,
        chunk_size=args.chunk_size,
        memory_limit=args.memory_limit,
        progress=False,
    )
    wall = time.perf_counter() - t0
    m = stats.metadata
    return {
        "wall_s": wall,
        "text_bytes": m["text_bytes"],
        "bytes_in": m["bytes_in"],
        "bytes_out": m["bytes_out"],
        "num_tokens": m["num_tokens"],
        "num_contexts": m["num_contexts"],
        "num_chunks": m["num_chunks"],
        "context_bytes": m["seqlen"] * (2 if m["dtype"] == "uint16" else 4),
        "build": m["build"],
    }


# --------------------------------------------------------------------------------------
# Parent.


def run_build(args, inputs: List[Path], cache: Path) -> dict:
    listing = cache.parent / "inputs.txt"
    listing.write_text("\n".join(map(str, inputs)))
    cmd = [sys.executable, "-m", "benches.scale_bench", "--child", "--cache", str(cache), "--input", str(listing)]
    cmd += ["--tokenizer", args.tokenizer, "--threads", str(args.threads), "--seqlen", str(args.seqlen)]
    cmd += ["--chunk-size", str(args.chunk_size), "--memory-limit", str(args.memory_limit)]
    load = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"build of {len(inputs)} files failed")
    r = json.loads(out)
    r["ru_maxrss_bytes"] = usage.ru_maxrss * 1024  # KiB on Linux
    r["cpu_s"] = usage.ru_utime + usage.ru_stime
    r["load"] = (load, os.getloadavg()[0])
    return r


def raw_disk(folder: Path, write_bytes: int, read_bytes: int) -> Dict[str, float]:
    """Seconds to write `write_bytes` sequentially (fsynced) and to read `read_bytes` back,
    warm (just written) and cold (dropped from the page cache first); the CPU time of all that."""
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    path = folder / "raw-disk.bin"
    block = os.urandom(BLOCK)  # incompressible, should the file system care
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t = time.perf_counter()
        left = write_bytes
        while left > 0:
            left -= os.write(fd, block[: min(left, BLOCK)])
        os.fsync(fd)
        write_s = time.perf_counter() - t
    finally:
        os.close(fd)

    def read() -> float:
        fd = os.open(path, os.O_RDONLY)
        try:
            t = time.perf_counter()
            left = read_bytes
            while left > 0:
                n = len(os.read(fd, min(left, BLOCK)))
                if n == 0:
                    break
                left -= n
            return time.perf_counter() - t
        finally:
            os.close(fd)

    warm = read()
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages: this drops them
    os.close(fd)
    cold = read()
    path.unlink()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {"write_s": write_s, "read_warm_s": warm, "read_cold_s": cold, "cpu_s": cpu}


def make_copies(sources: List[Path], folder: Path, copies: int) -> List[List[Path]]:
    """`copies` copies of `sources` in `folder` (copy i named ``cNNN-NAME``); the files of each."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(copies):
        out.append([])
        for src in sources:
            dst = folder / f"c{i:03}-{src.name}"
            if not dst.exists():
                shutil.copyfile(src, dst)
            out[-1].append(dst)
    return out


def make_smoke_source(args, folder: Path) -> List[Path]:
    from benches.build_bench import open_text

    first = sorted(p for p in Path(args.input).rglob("*") if p.is_file())[0]
    path = folder / "smoke.jsonl"
    left = SMOKE_BYTES
    with open_text(str(first)) as src, open(path, "w", encoding="utf-8") as dst:
        for line in src:
            dst.write(line)
            left -= len(line.encode("utf-8"))
            if left <= 0:
                break
    return [path]


def report(args, rows: List[dict]) -> str:
    info = machine_info()
    gib = args.memory_limit / 2**30
    lines = [
        "# tokshuf scale benchmark",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        "",
        f"Command: `python -m benches.{Path(__file__).stem} {' '.join(sys.argv[1:])}`",
        f"Input: {args.input}, copied 1..N times; tokenizer {args.tokenizer}, {args.threads} threads, "
        f"seqlen {args.seqlen}, chunk size {args.chunk_size}, memory_limit {gib:g} GiB. Medians of {args.runs} "
        "(each build in a fresh process); load average (1 min) before/after each build.",
        "",
        "| input | text | build s | text MB/s | MB per CPU-s | Mtok/s | peak RSS | tokenize s | plan s "
        "| write s (stage 2) | shards | raw write s | raw read s (warm / cold) | stage 2 / raw | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        b, raw = row["builds"], row["raw"]

        def m(f, b=b):
            return statistics.median(f(x) for x in b)

        def d(key):
            return m(lambda y: y["build"]["durations"].get(key, 0.0))

        raw_w = statistics.median(r["write_s"] for r in raw)
        raw_r = statistics.median(r["read_warm_s"] for r in raw)
        raw_c = statistics.median(r["read_cold_s"] for r in raw)
        ratio = m(lambda x: x["build"]["durations"]["write_s"]) / (raw_w + raw_r)
        ratio_cold = m(lambda x: x["build"]["durations"]["write_s"]) / (raw_w + raw_c)
        loads = ", ".join(f"{x['load'][0]:.1f}/{x['load'][1]:.1f}" for x in b)
        lines.append(
            f"| {b[0]['bytes_in'] / 1e9:.2f} GB | {b[0]['text_bytes'] / 1e9:.2f} GB | {m(lambda x: x['wall_s']):.1f} "
            f"| **{m(lambda x: x['text_bytes'] / 1e6 / x['wall_s']):.1f}** "
            f"| {m(lambda x: x['text_bytes'] / 1e6 / x['cpu_s']):.1f} "
            f"| {m(lambda x: x['num_tokens'] / 1e6 / x['wall_s']):.2f} "
            f"| {m(lambda x: x['ru_maxrss_bytes']) / 2**20:.0f} MiB "
            f"| {d('tokenize_s'):.1f} | {d('plan_s'):.2f} | {d('write_s'):.1f} "
            f"| {b[0]['bytes_out'] / 1e9:.2f} GB | {raw_w:.1f} | {raw_r:.2f} / {raw_c:.1f} "
            f"| **{ratio:.2f}** ({ratio_cold:.2f} cold) | {loads} |"
        )
    lines += [
        "",
        "Stage 2 in detail (`build.stage2`: seconds summed over threads, medians), and the CPU time "
        "of the raw figure (write, warm and cold read):",
        "",
    ]
    keys = sorted({k for row in rows for x in row["builds"] for k in x["build"].get("stage2", {})})
    if keys:
        lines += ["| input | " + " | ".join(keys) + " | raw cpu_s |", "|---|" + "---:|" * (len(keys) + 1)]
        for row in rows:
            b = row["builds"]
            vals = [statistics.median(x["build"].get("stage2", {}).get(k, 0.0) for x in b) for k in keys]
            raw_cpu = statistics.median(r["cpu_s"] for r in row["raw"])
            cells = " | ".join(f"{v:g}" if float(v).is_integer() else f"{v:.2f}" for v in vals)
            lines.append(f"| {b[0]['bytes_in'] / 1e9:.2f} GB | {cells} | {raw_cpu:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=DEFAULT_INPUT, help=f"a folder of input files (default {DEFAULT_INPUT})")
    p.add_argument("--copies", default="1,2,4,10", help="input sizes, in copies of --input (default 1,2,4,10)")
    p.add_argument("--runs", type=int, default=1, help="builds per size, sizes interleaved (default 1)")
    p.add_argument("--tokenizer", default="neox", help=f"{', '.join(TOKENIZERS)} or a spec (default neox)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: all usable cores")
    p.add_argument("--seqlen", type=int, default=2049)
    p.add_argument("--chunk-size", type=int, default=8192)
    p.add_argument("--memory-limit", type=parse_size, default=1 << 30, help="bytes, or 512MiB, 1GiB... (default 1GiB)")
    p.add_argument("--smoke", action="store_true", help="~3 MB of the first input file, copies 1,2: checks the script")
    p.add_argument("--workdir", default=None, help="scratch folder (default: a temp folder, deleted at the end)")
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child_build(args)))
        return
    work = Path(args.workdir or tempfile.mkdtemp(prefix="tokshuf-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.smoke:
            sources, args.copies = make_smoke_source(args, work), "1,2"
        else:
            sources = sorted(p for p in Path(args.input).rglob("*") if p.is_file())
        sizes = sorted({int(c) for c in args.copies.split(",")})
        copies = make_copies(sources, work / "input", sizes[-1])
        by_size: Dict[int, Dict[str, list]] = {k: {"builds": [], "raw": []} for k in sizes}
        cache = work / "cache"
        for run in range(args.runs):
            for k in sizes:
                shutil.rmtree(cache, ignore_errors=True)
                r = run_build(args, [f for c in copies[:k] for f in c], cache)
                shutil.rmtree(cache, ignore_errors=True)  # one cache at a time, and room for the raw file
                raw = raw_disk(work, r["bytes_out"], r["num_contexts"] * r["context_bytes"])
                by_size[k]["builds"].append(r)
                by_size[k]["raw"].append(raw)
                print(
                    f"[{k} copies, run {run + 1}/{args.runs}] {r['wall_s']:.1f} s, "
                    f"{r['text_bytes'] / 1e6 / r['wall_s']:.1f} MB/s, {r['ru_maxrss_bytes'] / 2**20:.0f} MiB, "
                    f"stages {r['build']['durations']}, stage 2 {r['build'].get('stage2')}, raw {raw}",
                    file=sys.stderr,
                )
        text = report(args, [by_size[k] for k in sizes])
        print(text)
        if args.out:
            Path(args.out).write_text(text)
    finally:
        shutil.rmtree(work / "input", ignore_errors=True)
        shutil.rmtree(work / "cache", ignore_errors=True)
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
