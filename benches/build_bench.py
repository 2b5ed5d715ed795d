"""End-to-end build throughput against the reference tokenizers and gigatoken.

For each tokenizer (``--tokenizers``: neox = tests/data/gpt-neox-20b.json, cl100k, r50k,
o200k = ``tiktoken:NAME_base``), on the same input files and the same number of threads,
median of ``--runs`` runs, each measurement in its own process:

- ``build``: ``tokshuf.build_cache`` end to end (read, decompress, parse JSON, tokenize,
  window, shuffle, write) with ``tokenizer_backend="auto"`` (the fast backend where it is
  exact): MB/s of document text (UTF-8 bytes of the text fields, as tokshuf.json's
  ``text_bytes``), tokens/s, peak RSS of the process (``wait4`` ru_maxrss and tokshuf.json's
  ``build.peak_rss_bytes``) and the time of each stage (``build.durations``); its ratio to
  the reference library and to gigatoken.
- ``build, tokenizer loaded``: the same build in a process that loaded the tokenizer first
  (``tokshuf.Tokenizer(spec)``, which a build in the same process reuses), as gigatoken's
  ``Tokenizer`` is made before its clock starts; ``--no-loaded`` skips it.
- ``--scaling`` (default when ``--threads`` > 1; ``--no-scaling`` skips it): the same build
  with 1 thread, and the 1 -> N speed-up.
- ``--with-reference-backend``: the same build with ``tokenizer_backend="reference"``.
- Baselines (``--no-reference`` skips them, ``--no-reference-library`` only the slow reference
  libraries), with ``RAYON_NUM_THREADS`` set to ``--threads``:
  ``reference``: the Python reference library on the same documents, already in memory,
  timing only the encode calls: HF ``tokenizers`` ``encode_batch_fast(add_special_tokens=False)``
  with ``encode_special_tokens = True`` for NeoX, tiktoken ``encode_ordinary_batch(num_threads=N)``
  for the tiktoken encodings. ``gigatoken`` (``pip install gigatoken``), the speed anchor:
  ``Tokenizer.encode_files(JsonlFileSource(files, field="text"))`` timed alone, so it reads
  its (plain .jsonl) files itself; a missing gigatoken is reported, not an error.

``--cases`` adds one-file inputs of ``--case-mb`` MB (default 10) drawn from the input by the
corpus's ``source`` key: ``code`` (Linux and Python sources), ``english`` (English docs,
dictionaries, prose), ``i18n`` (man pages in many languages, the Debian handbook and reference
in theirs); ``input`` is the input as given. A one-file case is where fixed costs (loading the
tokenizer) and cold memos show, and where one file must still use every thread.

Each run does build, build with the tokenizer loaded, 1-thread build, reference-backend build,
reference, gigatoken in turn,
so drifting machine load hits all of them alike; the summary table gives the median over runs
of each run's build / gigatoken ratio. Also printed: the bound on the fast
backend's memos. Writes a markdown report (machine, command, results, stage times) to
stdout and to ``--out``.

    python -m benches.build_bench                          # subset100m, neox + cl100k, all cores, 3 runs
    python -m benches.build_bench --smoke                  # ~3 MB, one run: checks the script
    python -m benches.build_bench --tokenizers neox,cl100k,r50k,o200k --threads 2 --runs 5
    python -m benches.build_bench --cases input,code,english,i18n --tokenizers neox,cl100k,r50k,o200k
    python -m benches.build_bench --input $TOKSHUF_CORPUS/jsonl.zst --with-reference-backend --no-scaling

The default input is ``$TOKSHUF_CORPUS/subset100m/jsonl`` (the corpus folder made by
../shared/corpus/make_corpus.py), else the committed sample (``benches/corpus.py``).

Run it on a quiet machine: other processes distort every number here. No assertions: it
measures, it does not check.
"""

from __future__ import annotations

import argparse
import contextlib
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
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the children run this file directly and import tests.support

from benches.corpus import corpus  # noqa: E402 (after the path above)

DEFAULT_INPUT = str(corpus("subset100m", "jsonl"))
TOKENIZERS = {
    "neox": str(ROOT / "tests" / "data" / "gpt-neox-20b.json"),
    "cl100k": "tiktoken:cl100k_base",
    "r50k": "tiktoken:r50k_base",
    "o200k": "tiktoken:o200k_base",
}
REF_BATCH_DOCS = 512  # documents per reference encode call (bounds the memory of HF Encodings)
SMOKE_BYTES = 3 << 20  # --smoke: about this much of the first input file
# The fast backend's memo per thread and tokenizer: 2^18 slots of 32 bytes (CACHE_BITS in
# rust/tokshuf-core/src/tokenize/fast.rs) plus at most 4 MiB of long pieces (LONG_BUDGET in
# rust/tokshuf-core/src/tokenize/piece_cache.rs).
MEMO_SLOT_BYTES = (1 << 18) * 32
MEMO_LONG_BYTES = 4 << 20


# --------------------------------------------------------------------------------------
# Children: one measurement each, result as JSON on stdout.


@contextlib.contextmanager
def fresh_build(workdir: str, inputs, **options):
    """``build_cache(inputs, WORKDIR/cache, progress=False, **options)`` from an empty output:
    yields (output folder, stats, wall seconds of the call); the cache is removed after."""
    import tokshuf

    out = Path(workdir) / "cache"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    stats = tokshuf.build_cache(inputs, out, progress=False, **options)
    seconds = time.perf_counter() - t0
    try:
        yield out, stats, seconds
    finally:
        shutil.rmtree(out, ignore_errors=True)


def child_build(args, loaded: bool = False) -> dict:
    if loaded:
        # As gigatoken's Tokenizer is made before its clock starts: the build finds it loaded.
        import tokshuf

        tokshuf.Tokenizer(TOKENIZERS[args.tokenizer], backend=args.backend)
    with fresh_build(
        args.workdir,
        args.input,
        tokenizer=TOKENIZERS[args.tokenizer],
        threads=args.threads,
        seqlen=args.seqlen,
        format=args.format,
        tokenizer_backend=args.backend,
    ) as (_, stats, wall):
        m = stats.metadata
        return {
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


def open_text(path: str):
    """A text stream of one input file, decompressed by its extension."""
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8")
    if path.endswith((".zst", ".zstd")):
        import zstandard

        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_texts(paths: List[str]) -> List[str]:
    from tokshuf._inputs import expand_inputs

    texts = []
    for path in expand_inputs(paths):
        with open_text(path) as f:
            for line in f:
                if line.strip():
                    text = json.loads(line).get("text")
                    if isinstance(text, str) and text:
                        texts.append(text)
    return texts


def child_reference(args) -> dict:
    texts = read_texts(args.input)
    batches = [texts[i : i + REF_BATCH_DOCS] for i in range(0, len(texts), REF_BATCH_DOCS)]
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

        from tests.support import tokref

        enc = tokref.tiktoken_reference(TOKENIZERS[args.tokenizer].split(":", 1)[1])
        for batch in batches:
            t0 = time.perf_counter()
            ids = enc.encode_ordinary_batch(batch, num_threads=args.threads)
            seconds += time.perf_counter() - t0
            tokens += sum(map(len, ids))
        what = f"tiktoken {tiktoken.__version__} encode_ordinary_batch"
    return {
        "encode_s": seconds,
        "text_bytes": text_bytes,
        "num_tokens": tokens,
        "num_documents": len(texts),
        "what": what,
    }


def child_gigatoken(args) -> dict:
    from tokshuf._inputs import expand_inputs

    try:
        import awkward as ak
        import gigatoken as gt
    except ImportError as e:
        return {"skipped": f"gigatoken not installed ({e.name})"}
    files = expand_inputs(args.input)
    if not all(f.endswith(".jsonl") for f in files):
        return {"skipped": "gigatoken reads plain .jsonl inputs only"}
    texts = read_texts(files)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts)
    del texts
    spec = TOKENIZERS[args.tokenizer]
    if spec.startswith("tiktoken:"):
        from tests.support import tokref

        # from_tiktoken takes the encoding's pattern and special tokens from the file's name.
        name = spec.split(":", 1)[1]
        path = Path(args.workdir) / f"{name}.tiktoken"
        path.write_bytes(gzip.decompress((tokref.EMBEDDED / f"{name}.tiktoken.gz").read_bytes()))
        tok = gt.Tokenizer.from_tiktoken(str(path))
    else:
        tok = gt.Tokenizer(spec)
    t0 = time.perf_counter()
    arr = tok.encode_files(gt.JsonlFileSource(files, field="text"))
    seconds = time.perf_counter() - t0
    tokens = int(ak.sum(ak.num(arr, axis=1)))
    try:
        import importlib.metadata

        version = importlib.metadata.version("gigatoken")
    except Exception:
        version = "?"
    return {
        "encode_s": seconds,
        "text_bytes": text_bytes,
        "num_tokens": tokens,
        "num_documents": len(arr),
        "what": f"gigatoken {version} encode_files",
    }


# --------------------------------------------------------------------------------------
# Parent: run children, collect medians, write the table.


def run_child(
    kind: str,
    args,
    tokenizer: str,
    inputs: List[str],
    threads: Optional[int] = None,
    backend: str = "auto",
    may_fail: bool = False,
) -> dict:
    threads = threads or args.threads
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        "--tokenizer-one",
        tokenizer,
        "--threads",
        str(threads),
        "--backend",
        backend,
        "--seqlen",
        str(args.seqlen),
        "--format",
        args.format,
        "--workdir",
        args.workdir,
        "--input",
        *inputs,
    ]
    env = dict(
        os.environ, RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads), TOKENIZERS_PARALLELISM="true"
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        if may_fail:
            return {"skipped": f"failed (exit {proc.returncode})"}
        raise SystemExit(f"{kind} {tokenizer} failed (exit {proc.returncode})")
    result = json.loads(out)
    result["ru_maxrss_bytes"] = usage.ru_maxrss * 1024  # KiB on Linux
    return result


def machine_info() -> Dict[str, str]:
    import importlib.metadata

    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    versions = {}
    for mod in ("tokshuf", "tokenizers", "tiktoken", "gigatoken"):
        try:
            versions[mod] = importlib.metadata.version(mod)
        except Exception:
            versions[mod] = "?"
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
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


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def med(values) -> float:
    return statistics.median(values)


def mbs(x: dict) -> float:
    return x["text_bytes"] / 1e6 / x.get("wall_s", x.get("encode_s"))


def tps(x: dict) -> float:
    return x["num_tokens"] / 1e6 / x.get("wall_s", x.get("encode_s"))


# The builds each run makes (those asked for), in table order, and how the tables tell them apart.
BUILDS = ("build", "build_loaded", "build_1", "build_ref")
BUILD_LABELS = {"build_loaded": ", tokenizer loaded first", "build_ref": ', tokenizer_backend="reference"'}


def per_run_ratio(builds: List[dict], baseline: List[dict]) -> float:
    """Median over runs of build MB/s / baseline MB/s, each pair measured side by side."""
    pairs = [(b, g) for b, g in zip(builds, baseline) if "skipped" not in g]
    return med([mbs(b) / mbs(g) for b, g in pairs]) if pairs else float("nan")


def report(args, results: Dict[tuple, dict], cases: Dict[str, List[str]]) -> str:
    info = machine_info()
    lines = [
        "# tokshuf build benchmark",
        "",
        "| machine | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in info.items()],
        f"| threads | {args.threads} (builds and baselines alike){'; builds also with 1' if args.scaling else ''} |",
        *[f"| case {c} | {', '.join(paths)}{' (--smoke)' if args.smoke else ''} |" for c, paths in cases.items()],
        f"| runs | {args.runs} per measurement, median reported |",
        "",
        "Command: `" + " ".join([Path(sys.executable).name, *sys.argv]) + "`",
        "",
        "tokshuf's whole build against gigatoken's encode alone, as the median over runs of the",
        "ratio of the two measured side by side (so load drifting between runs cancels):",
        "",
        "| case | tokenizer | MB of text | build MB/s | gigatoken MB/s | build / gigatoken | tokenizer loaded / gigatoken "
        f"| 1 thread / gigatoken | 1 -> {args.threads} threads |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    nan = float("nan")

    def ratio(v: float, base: float) -> str:
        return "-" if base != base or v != v else f"{v / base:.2f}x"

    def fmt(x: float) -> str:
        return "-" if x != x else f"{x:.2f}x"

    for (case, name), r in results.items():
        giga = [x for x in r["gigatoken"] if "skipped" not in x]
        giga_mbs = med([mbs(x) for x in giga]) if giga else nan
        b_mbs = med([mbs(x) for x in r["build"]])
        one = med([mbs(x) for x in r["build_1"]]) if r["build_1"] else nan
        lines.append(
            f"| {case} | {name} | {r['build'][0]['text_bytes'] / 1e6:.1f} | {b_mbs:.2f} | "
            f"{'-' if giga_mbs != giga_mbs else f'{giga_mbs:.2f}'} | {fmt(per_run_ratio(r['build'], r['gigatoken']))} | "
            f"{fmt(per_run_ratio(r['build_loaded'], r['gigatoken'])) if r['build_loaded'] else '-'} | "
            f"{fmt(per_run_ratio(r['build_1'], r['gigatoken'])) if r['build_1'] else '-'} | {ratio(b_mbs, one)} |"
        )
    lines += [
        "",
        "| case | tokenizer | what | threads | MB/s of text | Mtokens/s | vs reference | vs gigatoken | peak RSS | seconds | notes |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (case, name), r in results.items():
        ref = [x for x in r["reference"] if "skipped" not in x]
        giga = [x for x in r["gigatoken"] if "skipped" not in x]
        ref_mbs = med([mbs(x) for x in ref]) if ref else nan
        giga_mbs = med([mbs(x) for x in giga]) if giga else nan
        n_mbs = med([mbs(x) for x in r["build"]])
        for key in BUILDS:
            threads = 1 if key == "build_1" else args.threads
            builds = r[key]
            if not builds:
                continue
            b_mbs = med([mbs(x) for x in builds])
            rss = max(x["ru_maxrss_bytes"] for x in builds) / 2**20
            own_rss = max((x["peak_rss_bytes"] or 0) for x in builds) / 2**20
            note = f"1->{args.threads} threads speed-up {n_mbs / b_mbs:.2f}x" if key == "build_1" else ""
            backend = builds[0]["backend"] + BUILD_LABELS.get(key, "")
            lines.append(
                f"| {case} | {name} | tokshuf build_cache end to end ({backend}) | {threads} | "
                f"{b_mbs:.2f} | {med([tps(x) for x in builds]):.2f} | {ratio(b_mbs, ref_mbs)} | "
                f"{ratio(b_mbs, giga_mbs)} | {rss:.0f} MiB (own {own_rss:.0f}) | "
                f"{med([x['wall_s'] for x in builds]):.2f} | {note} |"
            )
        for key, label, rows in (("reference", "reference", r["reference"]), ("gigatoken", "anchor", r["gigatoken"])):
            if not rows:
                continue
            done = [x for x in rows if "skipped" not in x]
            if not done:
                lines.append(
                    f"| {case} | {name} | {label}: {key} | {args.threads} | - | - | - | - | - | - | {rows[0]['skipped']} |"
                )
                continue
            v = med([mbs(x) for x in done])
            lines.append(
                f"| {case} | {name} | {label}: {done[0]['what']} (encode only) | {args.threads} | {v:.2f} | "
                f"{med([tps(x) for x in done]):.2f} | {ratio(v, ref_mbs)} | {ratio(v, giga_mbs)} | "
                f"{max(x['ru_maxrss_bytes'] for x in done) / 2**20:.0f} MiB | "
                f"{med([x['encode_s'] for x in done]):.2f} | |"
            )
    # Stage times, in the order the build runs them.
    order = {"tokenize_s": 0, "plan_s": 1, "write_s": 2}
    stages = sorted(
        {k for r in results.values() for key in BUILDS for x in r[key] for k in x["durations"]},
        key=lambda k: (order.get(k, 9), k),
    )
    lines += [
        "",
        "Stage times of the builds (median seconds, `build.durations` in tokshuf.json; the rest of "
        "`total` is loading the tokenizer and writing metadata):",
        "",
        "| case | tokenizer | backend | threads | " + " | ".join(k.removesuffix("_s") for k in stages) + " | total |",
        "|---|---|---|---:|" + "---:|" * (len(stages) + 1),
    ]
    for (case, name), r in results.items():
        for key in BUILDS:
            threads = 1 if key == "build_1" else args.threads
            builds = r[key]
            if not builds:
                continue
            cells = [f"{med([x['durations'].get(k, 0.0) for x in builds]):.2f}" for k in stages]
            lines.append(
                f"| {case} | {name} | {builds[0]['backend']}{BUILD_LABELS.get(key, '')} | {threads} | "
                + " | ".join(cells)
                + f" | {med([x['total_s'] for x in builds]):.2f} |"
            )
    docs = {f"{c}/{n}": r["build"][0]["num_documents"] for (c, n), r in results.items()}
    memo = (MEMO_SLOT_BYTES + MEMO_LONG_BYTES) / 2**20
    lines += [
        "",
        f"Documents: {docs}. The reference rows time only the encode calls on "
        "documents already in memory; gigatoken's only its `encode_files` call (it reads the files "
        "itself, and its tokenizer is loaded before the clock starts); the build includes loading the "
        'tokenizer, reading, JSON parsing, decompression, windowing, shuffling and writing. "tokenizer '
        'loaded first" is the same build in a process where `tokshuf.Tokenizer(spec)` loaded the '
        "tokenizer before the clock started, as gigatoken's is.",
        "",
        f"Fast backend memo bound: 2^18 slots x 32 bytes = {MEMO_SLOT_BYTES / 2**20:.0f} MiB per thread "
        f"and tokenizer, plus at most {MEMO_LONG_BYTES / 2**20:.0f} MiB of long pieces per thread "
        f"(CACHE_BITS in rust/tokshuf-core/src/tokenize/fast.rs, LONG_BUDGET in "
        f"rust/tokshuf-core/src/tokenize/piece_cache.rs): "
        f"at most {memo:.0f} MiB x {plural(args.threads, 'thread')} = {memo * args.threads:.0f} MiB per tokenizer.",
    ]
    return "\n".join(lines) + "\n"


# Single-file cases drawn from the input by the corpus's `source` key (../shared/corpus/).
CASE_SOURCES = {
    "code": {"linux-code", "python-stdlib"},
    "english": {
        "man-en",
        "linux-docs",
        "python-docs",
        "perl-pod",
        "postgresql-docs",
        "info-manuals",
        "git-docs",
        "gcide",
        "wordnet",
        "foldoc",
        "jargon",
        "vera",
        "devils-dictionary",
        "elements",
        "kjv-bible",
        "fortunes",
    },
    "i18n": {"man-i18n", "debian-handbook", "debian-reference", "debian-dev-guides"},
}


def make_case_input(args, case: str) -> str:
    """One plain jsonl file of about --case-mb MB: the input documents of the case's sources."""
    from tokshuf._inputs import expand_inputs

    path = Path(args.workdir) / f"{case}.jsonl"
    budget = int(args.case_mb * 1e6)
    with open(path, "w", encoding="utf-8") as dst:
        for src_path in expand_inputs(args.input):
            with open_text(src_path) as src:
                for line in src:
                    if budget <= 0:
                        return str(path)
                    if json.loads(line).get("source") in CASE_SOURCES[case]:
                        dst.write(line)
                        budget -= len(line.encode("utf-8"))
    if path.stat().st_size == 0:
        raise SystemExit(f"case {case}: no input line has a source in {sorted(CASE_SOURCES[case])}")
    return str(path)


def make_smoke_input(args) -> str:
    """About SMOKE_BYTES of whole lines of the first input file, as plain jsonl in the workdir."""
    from tokshuf._inputs import expand_inputs

    first = expand_inputs(args.input)[0]
    path = Path(args.workdir) / "smoke.jsonl"
    budget = SMOKE_BYTES
    with open_text(first) as src, open(path, "w", encoding="utf-8") as dst:
        for line in src:
            dst.write(line)
            budget -= len(line.encode("utf-8"))
            if budget <= 0:
                break
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--input",
        nargs="+",
        default=[DEFAULT_INPUT],
        help=f"input files or folders (default {DEFAULT_INPUT}, from $TOKSHUF_CORPUS)",
    )
    p.add_argument("--tokenizers", default="neox,cl100k", help=f"comma-separated: {', '.join(TOKENIZERS)}")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: all usable cores")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--cases",
        default="input",
        help="comma-separated: input (the --input files as given), and one-file cases drawn from them by "
        f"the corpus's source key: {', '.join(CASE_SOURCES)}",
    )
    p.add_argument("--case-mb", type=float, default=10.0, help="size of each one-file case (default 10 MB)")
    p.add_argument("--seqlen", type=int, default=2049)
    p.add_argument("--format", default="npy")
    p.add_argument(
        "--scaling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also build with 1 thread and report the 1->N speed-up (default: on when --threads > 1)",
    )
    p.add_argument(
        "--loaded",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also build in a process that loaded the tokenizer first, as gigatoken's is (default: on)",
    )
    p.add_argument(
        "--with-reference-backend", action="store_true", help='also build with tokenizer_backend="reference" (slow)'
    )
    p.add_argument("--no-reference", action="store_true", help="only the builds: no reference library, no gigatoken")
    p.add_argument(
        "--no-reference-library",
        action="store_true",
        help="builds and gigatoken only (the reference libraries are slow)",
    )
    p.add_argument("--smoke", action="store_true", help="~3 MB of the first input file and one run: checks the script")
    p.add_argument("--workdir", default=None, help="scratch folder for the caches (default: a temp folder)")
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--child", choices=["build", "build_loaded", "reference", "gigatoken"], help=argparse.SUPPRESS)
    p.add_argument("--tokenizer-one", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="auto", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.tokenizer = args.tokenizer_one
        child = {
            "build": child_build,
            "build_loaded": lambda a: child_build(a, loaded=True),
            "reference": child_reference,
            "gigatoken": child_gigatoken,
        }[args.child]
        print(json.dumps(child(args)))
        return
    names = args.tokenizers.split(",")
    unknown = [n for n in names if n not in TOKENIZERS]
    if unknown:
        p.error(f"unknown tokenizers {unknown}; choose from {', '.join(TOKENIZERS)}")
    unknown = [c for c in args.cases.split(",") if c != "input" and c not in CASE_SOURCES]
    if unknown:
        p.error(f"unknown cases {unknown}; choose from input, {', '.join(CASE_SOURCES)}")
    if args.scaling is None:
        args.scaling = args.threads > 1
    elif args.scaling and args.threads == 1:
        print("--scaling with --threads 1: nothing to compare, skipped", file=sys.stderr)
        args.scaling = False
    own_tmp = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="tokshuf-bench-")
    try:
        if args.smoke:
            args.input, args.runs, args.case_mb = [make_smoke_input(args)], 1, 1
        cases = {c: (args.input if c == "input" else [make_case_input(args, c)]) for c in args.cases.split(",")}
        results = {}
        for case, inputs in cases.items():
            for name in names:
                r = results[(case, name)] = {key: [] for key in (*BUILDS, "reference", "gigatoken")}
                for run in range(args.runs):
                    # Alternate builds and baselines so drifting machine load hits all alike.
                    tag = f"[{case} {name} run {run + 1}/{args.runs}]"
                    steps = [("build", "build", args.threads, "auto")]
                    if args.loaded:
                        steps.append(("build_loaded", "build_loaded", args.threads, "auto"))
                    if args.scaling:
                        steps.append(("build_1", "build", 1, "auto"))
                    if args.with_reference_backend:
                        steps.append(("build_ref", "build", args.threads, "reference"))
                    if not args.no_reference:
                        if not args.no_reference_library:
                            steps.append(("reference", "reference", args.threads, "auto"))
                        steps.append(("gigatoken", "gigatoken", args.threads, "auto"))
                    for key, kind, threads, backend in steps:
                        x = run_child(
                            kind, args, name, inputs, threads=threads, backend=backend, may_fail=kind == "gigatoken"
                        )
                        r[key].append(x)
                        if "skipped" in x:
                            print(f"{tag} {key}: {x['skipped']}", file=sys.stderr)
                        else:
                            secs = x.get("wall_s", x.get("encode_s"))
                            what = x.get("backend") or x.get("what", "")
                            print(
                                f"{tag} {key} {what} {plural(threads, 'thread')}: {secs:.2f} s ({mbs(x):.2f} MB/s)",
                                file=sys.stderr,
                            )
        text = report(args, results, cases)
        print(text)
        if args.out:
            Path(args.out).write_text(text)
    finally:
        if own_tmp:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
