"""Tokenizer throughput: tokshuf's build end to end next to the reference pipelines (issue 4).

    python benches/tokenize_bench.py                      # the 100 MB subset, 2 threads, 3 runs
    python benches/tokenize_bench.py --smoke              # a few MB, one run: checks the script
    python benches/tokenize_bench.py --subset DIR --runs 5 --threads 2 --with-reference

Measured, each the median of --runs runs, in MB/s of document text:
- tokshuf ``build_cache`` end to end (read + parse jsonl, tokenize, window, shuffle, write
  shards), fast backend, with --threads and with 1 thread (scaling), plus peak RSS and the
  bound on the fast backend's memos; ``--with-reference`` adds the reference backend.
- The baselines of ../shared/corpus/README.md, re-measured in the same run on the same text:
  tokenize + EOT + pack into 2049-token contexts, texts already in memory (so they pay no
  reading, unlike tokshuf): HF ``tokenizers`` ``encode_batch_fast`` (GPT-NeoX-20B), tiktoken
  ``encode_ordinary_batch`` (cl100k_base) and gigatoken (``pip install gigatoken``; reading
  its files itself with ``encode_files``), the speed anchor. Each baseline runs in a fresh
  subprocess with ``RAYON_NUM_THREADS`` set, so it uses --threads threads.

Timings on a busy machine are meaningless; run it on a quiet one. No assertion here.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT_SUBSET = Path(os.environ.get("TOKSHUF_CORPUS", ROOT.parent / "corpus" / "out")) / "subset100m" / "jsonl"
SEQLEN = 2049
# 2^18 slots of 32 bytes per thread and tokenizer (CACHE_BITS in rust/tokshuf-core/src/fast.rs).
MEMO_BYTES_PER_THREAD = (1 << 18) * 32


def tokenizers_of(neox_json: str):
    return {"neox": neox_json, "cl100k": "tiktoken:cl100k_base", "r50k": "tiktoken:r50k_base",
            "o200k": "tiktoken:o200k_base"}


def text_bytes(files) -> int:
    n = 0
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                n += len(json.loads(line).get("text", "").encode("utf-8"))
    return n


def tokshuf_build(files, spec, threads, backend, runs):
    import tokshuf

    rates, rss = [], 0
    for _ in range(runs):
        out = Path(tempfile.mkdtemp(prefix="tokshuf-bench-"))
        try:
            st = tokshuf.build_cache(files, out / "cache", tokenizer=spec, threads=threads, seqlen=SEQLEN,
                                     progress=False, tokenizer_backend=backend)
            rates.append(st.mb_per_s)
            rss = max(rss, st.metadata.get("build", {}).get("peak_rss_bytes", 0))
            backend_name = st.metadata["tokenizer"]["backend"]
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return statistics.median(rates), rates, rss, backend_name


# One baseline measurement, run in a subprocess: prints {"mbps": ..., "n_ctx": ...}.
BASELINE = r"""
import json, sys, time
import numpy as np
kind, spec, files, threads = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
SEQLEN = 2049
texts = []
for f in files:
    with open(f, encoding="utf-8") as fh:
        texts.extend(t for t in (json.loads(line).get("text") for line in fh) if t)
nbytes = sum(len(t.encode("utf-8")) for t in texts)

def pack(lists, eot):
    flat = np.fromiter((i for ids in lists for i in (*ids, eot)), dtype=np.uint32)
    return flat[: len(flat) // SEQLEN * SEQLEN].reshape(-1, SEQLEN)

if kind == "hf":
    import tokenizers
    tok = tokenizers.Tokenizer.from_file(spec)
    tok.encode_special_tokens = True
    t0 = time.perf_counter()
    enc = tok.encode_batch_fast(texts, add_special_tokens=False)
    ctx = pack((e.ids for e in enc), 0)
elif kind == "tiktoken":
    import tokref
    enc = tokref.tiktoken_reference(spec.split(":")[1])
    t0 = time.perf_counter()
    ctx = pack(enc.encode_ordinary_batch(texts, num_threads=threads), enc.eot_token)
elif kind == "gigatoken":
    import awkward as ak
    import gigatoken as gt
    if spec.startswith("tiktoken:"):
        import tokref
        name = spec.split(":")[1]
        path = "/tmp/" + name + ".tiktoken"
        import gzip
        open(path, "wb").write(gzip.decompress((tokref.EMBEDDED / (name + ".tiktoken.gz")).read_bytes()))
        tok, eot = gt.Tokenizer.from_tiktoken(path), tokref.tiktoken_reference(name).eot_token
    else:
        tok, eot = gt.Tokenizer(spec), 0
    t0 = time.perf_counter()
    arr = tok.encode_files(gt.JsonlFileSource(files, field="text"))
    counts = np.asarray(ak.num(arr, axis=1))
    flat = np.asarray(ak.flatten(arr)).astype(np.uint32)
    # EOT after each document, then pack.
    ends = np.cumsum(counts)
    flat = np.insert(flat, ends, eot)
    ctx = flat[: len(flat) // SEQLEN * SEQLEN].reshape(-1, SEQLEN)
dt = time.perf_counter() - t0
print(json.dumps({"mbps": nbytes / 1e6 / dt, "n_ctx": int(len(ctx))}))
"""


def baseline(kind, spec, files, threads, runs):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads),
               TOKENIZERS_PARALLELISM="true")
    rates = []
    for _ in range(runs):
        r = subprocess.run([sys.executable, "-c", BASELINE, kind, spec, json.dumps([str(f) for f in files]),
                            str(threads), str(ROOT / "tests")], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            return None, (r.stderr.strip().splitlines() or ["failed"])[-1]
        rates.append(json.loads(r.stdout.strip().splitlines()[-1])["mbps"])
    return statistics.median(rates), rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subset", type=Path, default=DEFAULT_SUBSET, help="folder of jsonl files (default: the 100 MB subset)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenizers", default="neox,cl100k", help="comma list of neox, cl100k, r50k, o200k")
    ap.add_argument("--with-reference", action="store_true", help="also build with the reference backend (slow)")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a few MB of text and one run, to check the script")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()

    import tokref

    files = sorted(args.subset.glob("*.jsonl"))
    if not files:
        print(f"no .jsonl files in {args.subset}", file=sys.stderr)
        return 2
    tmp = None
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="tokshuf-bench-smoke-"))
        with open(files[0], encoding="utf-8") as src, open(tmp / "smoke.jsonl", "w", encoding="utf-8") as dst:
            budget = 3 << 20
            for line in src:
                dst.write(line)
                budget -= len(line)
                if budget <= 0:
                    break
        files, args.runs = [tmp / "smoke.jsonl"], 1
    mb = text_bytes(files) / 1e6
    print(f"{len(files)} files, {mb:,.1f} MB of text; {args.threads} threads; median of {args.runs} runs; "
          f"{os.cpu_count()} CPUs")
    results = {"text_mb": mb, "threads": args.threads, "runs": args.runs, "rows": []}

    def row(what, tok, mbps, extra=""):
        results["rows"].append({"what": what, "tokenizer": tok, "mb_per_s": mbps, "extra": extra})
        shown = "failed" if mbps is None else f"{mbps:8.1f}"
        print(f"  {what:<44} {tok:<7} {shown} MB/s  {extra}")

    specs = tokenizers_of(str(tokref.NEOX_JSON))
    anchors = {}
    for name in args.tokenizers.split(","):
        spec = specs[name]
        if not args.no_baselines:
            if name == "neox":
                r = baseline("hf", spec, files, args.threads, args.runs)
                row("HF tokenizers encode_batch_fast", name, r[0], "" if r[0] else r[1])
            else:
                r = baseline("tiktoken", spec, files, args.threads, args.runs)
                row("tiktoken encode_ordinary_batch", name, r[0], "" if r[0] else r[1])
            r = baseline("gigatoken", spec, files, args.threads, args.runs)
            anchors[name] = r[0]
            row("gigatoken encode_files (anchor)", name, r[0], "" if r[0] else r[1])
        for backend in (["fast", "reference"] if args.with_reference else ["fast"]):
            med, rates, rss, used = tokshuf_build(files, spec, args.threads, backend, args.runs)
            ratio = f", {med / anchors[name]:.2f}x gigatoken" if anchors.get(name) else ""
            row(f"tokshuf build_cache [{used}], {args.threads} threads", name, med,
                f"peak RSS {rss / 2**20:,.0f} MiB{ratio}")
            if backend == "fast" and args.threads != 1:
                one, _, _, _ = tokshuf_build(files, spec, 1, backend, args.runs)
                row(f"tokshuf build_cache [{used}], 1 thread", name, one,
                    f"scaling 1->{args.threads}: {med / max(one, 1e-9):.2f}x")
    print(f"  fast backend memo: {MEMO_BYTES_PER_THREAD / 2**20:.0f} MiB per thread and tokenizer (bounded)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
