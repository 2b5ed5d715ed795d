"""The Ray engine against the local engine, on the same CPUs.

The same build (``--tokenizer``, ``--seqlen``, ``--chunk-size``) of ``--input`` is run
``--runs`` times each way, every run into a fresh output folder:

- ``local``: ``build_cache(threads=CPUS)``, no Ray running.
- ``ray 1x{CPUS}``: a local Ray cluster of one node with CPUS CPUs; tasks of CPUS CPUs.
- ``ray {CPUS}x1``: CPUS nodes of 1 CPU each (a head and CPUS-1 workers, separate raylets on
  loopback, as in tests/support/ray_cluster.py); tasks of 1 CPU.

Every build runs in a fresh process (for Ray a fresh job, whose worker processes start and
load the tokenizer in its first tasks), with the cluster already up (its start-up is reported
on its own); local and Ray builds alternate. The build time is tokshuf.json's
``build.total_s``, split into its ``durations``: for Ray ``connect_s`` (importing Ray and
joining the cluster, while the driver makes the recipe), ``tokenize_s`` (stage 1, with the
workers' start, their node check and their tokenizer load), ``plan_s`` (stitch and chunk plan on the driver), ``regroup_s`` (spills rewritten in cell
order), ``write_s`` (stage 2); "process s" is the whole process (interpreter start, imports,
build). Overhead: median Ray build time / median local build time - 1. Every cache is checked
byte-identical to the local one (tokshuf.json but ``build``).

    python -m benches.ray_bench                                   # subset100m if present, else tests/data/sample
    python -m benches.ray_bench --input tests/data/sample --runs 5 --chunk-size 64
    python -m benches.ray_bench --input $TOKSHUF_CORPUS/subset100m/jsonl --tokenizer cl100k

Measures, does not check speed. Run on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
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
from typing import Any, Dict, List

import tokshuf
from tokshuf import _ray

from benches.corpus import corpus
from tests.support.ray_cluster import local_cluster  # sets Ray's loopback environment before Ray loads

ROOT = Path(__file__).resolve().parent.parent

TOKENIZERS = {"neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"), "cl100k": "tiktoken:cl100k_base"}


def args_for(inputs: List[str], out: Path, a: argparse.Namespace) -> Dict[str, Any]:
    return dict(
        inputs=inputs, output=str(out), tokenizer=TOKENIZERS[a.tokenizer], seqlen=a.seqlen, chunk_size=a.chunk_size,
        num_local_cells=None, local_cell_dir=None, seed=0, text_key="text", format="npy", tail="stitch",
        eot_id=None, pad_id=None, bos=False, bos_id=None, allow_special_tokens=False, shuffle=True,
        memory_limit=4 << 30, errors="raise", overwrite=False,
    )  # fmt: skip


def same(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(p.name for p in b.iterdir()):
        return False
    for name in names:
        x, y = (a / name).read_bytes(), (b / name).read_bytes()
        if name == "tokshuf.json":
            mx, my = json.loads(x), json.loads(y)
            mx.pop("build"), my.pop("build")
            if mx != my:
                return False
        elif x != y:
            return False
    return True


LOCAL = """
import json, sys, tokshuf
a = json.loads(sys.argv[1])
meta = tokshuf.build_cache(a["inputs"], a["output"], tokenizer=a["tokenizer"], seqlen=a["seqlen"],
                           chunk_size=a["chunk_size"], threads=int(sys.argv[2]), progress=False).metadata
print(json.dumps(meta))
"""
RAY = """
import json, sys
from tokshuf import _ray
meta = _ray.build(json.loads(sys.argv[1]), _ray.RayOptions(address=sys.argv[2], cpus_per_task=int(sys.argv[3])),
                  progress=False)
print(json.dumps(meta))
"""


def measure(code: str, argv: List[str], out: Path) -> Dict[str, Any]:
    """One build in a fresh process (a fresh Ray job: its workers start and load the tokenizer)."""
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *argv], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    meta = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "wall_s": wall,
        "total_s": meta["build"]["total_s"],
        "durations": meta["build"]["durations"],
        "out": out,
        "meta": meta,
    }


def run_local(inputs: List[str], tmp: Path, a: argparse.Namespace, k: int) -> Dict[str, Any]:
    out = tmp / f"local{k}"
    return measure(LOCAL, [json.dumps(args_for(inputs, out, a)), str(a.cpus)], out)


def run_ray(
    inputs: List[str], tmp: Path, a: argparse.Namespace, name: str, k: int, address: str, cpus: int
) -> Dict[str, Any]:
    out = tmp / f"{name}-{k}"
    return measure(RAY, [json.dumps(args_for(inputs, out, a)), address, str(cpus)], out)


def med(runs: List[Dict[str, Any]], key: str) -> float:
    vals = [r[key] if key in r else r["durations"].get(key, 0.0) for r in runs]
    return statistics.median(vals) if vals else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=str(corpus("subset100m", "jsonl")))
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="neox")
    p.add_argument("--cpus", type=int, default=2, help="total CPUs of every configuration (default 2)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seqlen", type=int, default=2049)
    p.add_argument("--chunk-size", type=int, default=1024)
    p.add_argument("--out", default=None, help="also write the markdown report here")
    a = p.parse_args()
    inputs = tokshuf._inputs.expand_inputs(a.input)
    in_bytes = sum(os.path.getsize(f) for f in inputs)
    tmp = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    results: Dict[str, List[Dict[str, Any]]] = {}
    starts: Dict[str, float] = {}
    load = [os.getloadavg()]
    results["local"] = []
    try:
        for name, workers, cpus in ((f"ray 1x{a.cpus}", 0, a.cpus), (f"ray {a.cpus}x1", a.cpus - 1, 1)):
            with local_cluster(workers=workers, cpus=cpus) as cluster:
                starts[name] = cluster.start_s
                tag = name.replace(" ", "_")
                runs = []
                # Local and Ray builds alternate, so that both see the same background load.
                for k in range(a.runs):
                    results["local"].append(run_local(inputs, tmp, a, len(results["local"])))
                    runs.append(run_ray(inputs, tmp, a, tag, k, cluster.address, cpus))
            reference = results["local"][0]["out"]
            for r in runs:
                if not same(reference, r["out"]):
                    raise SystemExit(f"{name}: cache differs from the local engine's ({r['out']})")
                shutil.rmtree(r["out"])
            results[name] = runs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load.append(os.getloadavg())

    text = results["local"][0]["meta"]["text_bytes"]
    lines = [
        f"# ray_bench {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"- machine: {platform.node()}, {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, tokshuf {tokshuf.__version__}, ray {_ray.import_ray().__version__}",
        f"- command: python {' '.join(sys.argv)}",
        f"- input: {a.input} ({len(inputs)} files, {in_bytes / 1e6:.1f} MB, {text / 1e6:.1f} MB of text); "
        f"tokenizer {a.tokenizer}, seqlen {a.seqlen}, chunk size {a.chunk_size}, "
        f"{results['local'][0]['meta']['num_chunks']} chunks; {a.cpus} CPUs in every configuration",
        "- every Ray cache byte-identical to the local one (tokshuf.json but `build`); local and Ray builds "
        "alternate (the local ones while the idle cluster is up)",
        f"- load average (1, 5, 15 min) at the start {', '.join(f'{x:.2f}' for x in load[0])}, "
        f"at the end {', '.join(f'{x:.2f}' for x in load[1])}",
        "",
        "| engine | cluster start s | build s (median) | vs local | MB/s of text | connect s | tokenize s | plan s | regroup s | write s | process s | runs (build s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = med(results["local"], "total_s")
    for name, runs in results.items():
        build = med(runs, "total_s")
        start = f"{starts[name]:.1f}" if name in starts else ""
        overhead = "" if name == "local" else f"{build / base - 1:+.0%}"
        each = ", ".join(f"{r['total_s']:.2f}" for r in runs)
        lines.append(
            f"| {name} | {start} | {build:.2f} | {overhead} | {text / 1e6 / build:.1f} | "
            f"{med(runs, 'connect_s'):.2f} | {med(runs, 'tokenize_s'):.2f} | {med(runs, 'plan_s'):.3f} | "
            f"{med(runs, 'regroup_s'):.2f} | "
            f"{med(runs, 'write_s'):.2f} | {med(runs, 'wall_s'):.2f} | {each} |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if a.out:
        Path(a.out).write_text(report)


if __name__ == "__main__":
    main()
