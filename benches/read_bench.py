"""Reader benchmarks (issues 3 and 16): tokens/s delivered as NumPy batches by tokshuf's Reader
(every member format, endless and single pass, 1 and 2 threads, page cache warm and cold)
against a plain NumPy copy of the same tokens into the output dtype (and, to show what that
yardstick leaves out, the same copy into 5 arrays in turn and a NumPy gather of random rows),
stock webdataset on the same tars, and mosaicml-streaming (MDS) and litdata's TokensLoader on
the same contexts (when installed); bytes per token of each format; a blend; seek time to step
1 and 10^9; the time to open a cache of 100,000 chunks in a fresh process, and to list its folder
alone.

    python -m benches.read_bench --build CORPUS_DIR --out /tmp/bench   # builds every format
    python -m benches.read_bench --cache CACHE                         # one existing cache
    python -m benches.read_bench --cache CACHE --unpacked UNPACKED     # and an unpacked one
    python -m benches.read_bench --smoke                               # tiny: checks the script

"Cold" drops the shards from the page cache before the run (posix_fadvise DONTNEED on every
shard file; the files must not be held open by another process). Each figure is the median of
--runs interleaved runs; the CPU time of the process is reported beside the wall time, since
on a shared machine wall time measures the neighbours too. With --json PATH results are
written as JSON.
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import tokshuf


def drop_page_cache(cache: tokshuf.Cache) -> None:
    """Evict a cache's shards from the page cache (cold reads)."""
    for p in glob.glob(os.path.join(cache.path, "shard_*.tar")):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(batches: Iterator[np.ndarray], tokens: int) -> Tuple[float, float]:
    """(wall Mtok/s, Mtok per CPU second of this process) over `tokens` tokens of batches."""
    w0, c0, n = time.perf_counter(), time.process_time(), 0
    for b in batches:
        n += b.size
        if n >= tokens:
            break
    return n / (time.perf_counter() - w0) / 1e6, n / max(time.process_time() - c0, 1e-9) / 1e6


def measure(
    name: str,
    make: Callable[[], Iterator[np.ndarray]],
    tokens: int,
    runs: int,
    results: Dict,
    cold=None,
    yardstick: Optional[Callable[[], Iterator[np.ndarray]]] = None,
) -> None:
    """Median over `runs` runs of `tokens` tokens each; `cold()` before each run, or (warm) one
    untimed pass first. With a `yardstick`, it runs just before each run too, and the ratio to it
    is the median of the runs' ratios: the machine's memory bandwidth moves between runs as
    much as the ratio the issue asks for."""
    if cold is None:
        timed(make(), tokens)
    got, ratios = [], []
    for _ in range(runs):
        ref = timed(yardstick(), tokens) if yardstick is not None else None
        if cold is not None:
            cold()
        got.append(timed(make(), tokens))
        if ref is not None:
            ratios.append((got[-1][0] / ref[0], got[-1][1] / ref[1]))
    wall, cpu = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
    results[name] = {"mtok_per_s": wall, "mtok_per_cpu_s": cpu, "runs": [list(g) for g in got]}
    if ratios:
        results[name]["vs_copy_paired"] = statistics.median(r[0] for r in ratios)
        results[name]["vs_copy_paired_cpu"] = statistics.median(r[1] for r in ratios)
    print(f"  {name:<46}{wall:>9.0f} Mtok/s {cpu:>9.0f} per CPU-s", flush=True)


def endless(make: Callable[[], Iterator[np.ndarray]]) -> Iterator[np.ndarray]:
    """Single passes one after the other: as many tokens as the endless reader gives."""
    while True:
        yield from make()


def source_batches(contexts: np.ndarray, batch: int) -> Iterator[np.ndarray]:
    """Consecutive batches of `contexts`, round and round."""
    k = 0
    while True:
        lo = (k * batch) % (len(contexts) - batch + 1)
        yield contexts[lo : lo + batch]
        k += 1


def copy_batches(contexts: np.ndarray, batch: int, dtype: str) -> Iterator[np.ndarray]:
    """The yardstick: the same tokens, already in memory, copied batch by batch into a new array
    of the output dtype (what any reader has to do at least once)."""
    return (b.astype(dtype) for b in source_batches(contexts, batch))


def copy_rotating(contexts: np.ndarray, batch: int, dtype: str, buffers: int) -> Iterator[np.ndarray]:
    """The copy into `buffers` output arrays in turn: a reader that hands batches to the
    consumer from a read-ahead thread has several in flight (a one-thread Reader with
    prefetch=2 keeps 5), so they cannot all stay in cache as `copy_batches`' one array does."""
    out = [np.empty((batch, contexts.shape[1]), dtype=dtype) for _ in range(buffers)]
    for k, b in enumerate(source_batches(contexts, batch)):
        np.copyto(out[k % buffers], b, casting="unsafe")
        yield out[k % buffers]


def gather_random(contexts: np.ndarray, batch: int, dtype: str) -> Iterator[np.ndarray]:
    """NumPy gathering `batch` random rows into the output dtype: the access pattern of an
    endless reader's shuffled epochs, from memory instead of the page cache."""
    rng = np.random.default_rng(0)
    while True:
        yield contexts[rng.integers(0, len(contexts), batch)].astype(dtype)


def bench_copy(contexts: np.ndarray, batch: int, dtype: str, tokens: int, runs: int, results: Dict) -> None:
    """The yardstick, then two copies that show what it leaves out (not used in the ratios)."""
    measure(f"numpy copy -> {dtype}", lambda: copy_batches(contexts, batch, dtype), tokens, runs, results)
    measure(
        f"numpy copy -> {dtype}, 5 buffers in turn",
        lambda: copy_rotating(contexts, batch, dtype, 5),
        tokens,
        runs,
        results,
    )
    measure(
        f"numpy gather of random rows -> {dtype}", lambda: gather_random(contexts, batch, dtype), tokens, runs, results
    )


def bench_tokshuf(
    caches: Dict[str, tokshuf.Cache],
    contexts: np.ndarray,
    batch: int,
    dtype: str,
    tokens: int,
    runs: int,
    results: Dict,
) -> None:
    """Every format, endless and single pass, 1 and 2 read threads, each run paired with a run of
    the NumPy copy (`copy_batches`)."""

    def copy():
        return copy_batches(contexts, batch, dtype)

    for fmt, cache in caches.items():
        for threads in (1, 2):
            for single in (False, True):

                def run(cache=cache, threads=threads, single=single):
                    def reader():
                        return iter(
                            tokshuf.Reader(
                                cache,
                                batch_size=batch,
                                dtype=dtype,
                                prefetch=2 * threads,
                                threads=threads,
                                single_pass=single,
                            )
                        )

                    return endless(reader) if single else reader()

                what = "single pass" if single else "endless"
                measure(f"tokshuf {fmt} {what} {dtype} t={threads}", run, tokens, runs, results, yardstick=copy)
        run = lambda cache=cache: tokshuf.Reader(cache, batch_size=batch, dtype=dtype, threads=2, prefetch=4)  # noqa: E731
        measure(
            f"tokshuf {fmt} endless {dtype} t=2 cold",
            run,
            tokens,
            runs,
            results,
            cold=lambda c=cache: drop_page_cache(c),
            yardstick=copy,
        )


def bytes_per_token(caches: Dict[str, tokshuf.Cache], results: Dict) -> None:
    for fmt, cache in caches.items():
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(cache.path, "shard_*.tar")))
        bpt = size / (len(cache) * cache.seqlen)
        results[f"bytes per token {fmt}"] = bpt
        print(f"  {fmt:<12}{size / 1e6:>10.1f} MB {bpt:>8.3f} bytes/token", flush=True)


def bench_blend(cache: tokshuf.Cache, batch: int, tokens: int, runs: int, results: Dict) -> None:
    """The cache read as a 70/30 blend of itself: the cost of the blend path (schedule lookup,
    rows from two caches) against the single-cache rows; and seek in a blend."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "listed twice"
        blend = tokshuf.Blend([(cache, 0.7), (tokshuf.Cache(cache.path), 0.3)])
    run = lambda: iter(tokshuf.Reader(blend, batch_size=batch, dtype="int32", prefetch=4, threads=2))  # noqa: E731
    measure("tokshuf blend int32 t=2", run, tokens, runs, results)
    r = tokshuf.Reader(blend, batch_size=batch, prefetch=0)
    for step in (1, 10**9):
        r.seek(step=step)
        next(r)
        reps = 50
        t0 = time.perf_counter()
        for _ in range(reps):
            r.seek(step=step)
            next(r)
        ms = (time.perf_counter() - t0) / reps * 1e3
        results[f"blend seek+batch step {step}"] = {"ms": ms}
        print(f"  blend seek+batch to step {step:<12}{ms:>10.3f} ms", flush=True)


class RealIds:
    """What `timed` counts of an unpacked batch: its real ids, padding left out."""

    def __init__(self, size: int) -> None:
        self.size = size


def bench_unpacked(path: str, batch: int, dtypes: List[str], tokens: int, runs: int, results: Dict) -> None:
    """An unpacked cache (packing="none"): real ids per second, one and two read threads."""

    def real_ids(reader: tokshuf.Reader) -> Iterator[RealIds]:
        for b in reader:
            yield RealIds(int(b.num_tokens))

    for dtype in dtypes:
        for threads in (1, 2):
            run = functools.partial(
                lambda d, t: real_ids(tokshuf.Reader(path, batch_size=batch, dtype=d, prefetch=2, threads=t)),
                dtype,
                threads,
            )
            measure(f"tokshuf unpacked {dtype} t={threads}", run, tokens, runs, results)


def rows_of(batches: Iterator[np.ndarray], batch: int) -> Iterator[np.ndarray]:
    """Samples of other loaders stacked into batches of `batch` contexts."""
    rows: List[np.ndarray] = []
    for row in batches:
        rows.append(row)
        if len(rows) == batch:
            yield np.stack(rows)
            rows = []


def bench_webdataset(cache: tokshuf.Cache, batch: int, tokens: int, runs: int, results: Dict) -> None:
    try:
        import webdataset as wds
    except ImportError:
        print("  webdataset not installed: skipped")
        return
    import warnings

    shards = sorted(glob.glob(os.path.join(cache.path, "shard_*.tar")))
    key = "npy" if cache.format in ("npy", "blocks") else cache.format

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for s in endless(lambda: iter(wds.WebDataset(shards, shardshuffle=False).decode())):
                yield from np.asarray(s[key]).reshape(-1, cache.seqlen)

    measure(f"webdataset (stock, .decode()) {cache.format}", lambda: rows_of(run(), batch), tokens, runs, results)


def bench_streaming(contexts: np.ndarray, batch: int, tokens: int, runs: int, results: Dict, tmp: Path) -> None:
    try:
        from streaming import MDSWriter, StreamingDataset
    except ImportError:
        print("  mosaicml-streaming not installed: skipped")
        return
    out = tmp / "mds"
    seqlen = contexts.shape[1]
    with MDSWriter(out=str(out), columns={"tokens": f"ndarray:{contexts.dtype.name}:{seqlen}"}) as w:
        for row in contexts:
            w.write({"tokens": row})

    def run():
        ds = StreamingDataset(local=str(out), batch_size=batch, shuffle=False)
        return rows_of(endless(lambda: (s["tokens"] for s in ds)), batch)

    measure("mosaicml-streaming (MDS)", run, tokens, runs, results)


def _litdata_rows(path: str, step: int, i: int):
    """litdata's optimize input: `step` contexts from `i` as one int32 tensor (a top-level
    function: its workers are spawned)."""
    import torch

    return torch.from_numpy(np.load(path, mmap_mode="r")[i : i + step].reshape(-1).astype(np.int32))


def bench_litdata(contexts: np.ndarray, batch: int, tokens: int, runs: int, results: Dict, tmp: Path) -> None:
    try:
        import litdata
        from litdata.streaming.item_loader import TokensLoader
    except ImportError:
        print("  litdata not installed: skipped")
        return
    out = tmp / "litdata"
    seqlen = contexts.shape[1]
    np.save(tmp / "contexts.npy", contexts)
    step = 256
    litdata.optimize(
        fn=functools.partial(_litdata_rows, str(tmp / "contexts.npy"), step),
        inputs=list(range(0, len(contexts), step)),
        output_dir=str(out),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
    )

    def run():
        ds = litdata.StreamingDataset(str(out), item_loader=TokensLoader(block_size=seqlen))
        return rows_of(endless(lambda: (s.numpy() for s in ds)), batch)

    measure("litdata TokensLoader (int32)", run, tokens, runs, results)


def bench_seek(cache: tokshuf.Cache, batch: int, results: Dict) -> None:
    r = tokshuf.Reader(cache, batch_size=batch, prefetch=0)
    for step in (1, 10**9):
        for what, fn in (
            ("locate", lambda s=step: r.locate(s * batch)),
            ("seek+batch", lambda s=step: (r.seek(step=s), next(r))),
        ):
            fn()
            reps = 50
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            ms = (time.perf_counter() - t0) / reps * 1e3
            results[f"{what} step {step}"] = {"ms": ms}
            print(f"  {what} to step {step:<12}{ms:>10.3f} ms", flush=True)


def make_synthetic(root: Path, chunks: int, chunk_size: int, seqlen: int) -> None:
    """A cache of `chunks` sparse shards (right sizes, no data) with the manifest lines a build
    writes: what opening has to read and check."""
    root.mkdir(parents=True, exist_ok=True)
    stride = 512 + -(-(128 + 2 * seqlen) // 512) * 512
    size = chunk_size * stride + 1024
    line = '{{"shard":"shard_{c:08}","num_sequences":{n},"num_tokens":{t},"bytes":{b},"sha256":"{h}"}}\n'
    with open(root / "manifest.jsonl", "w") as m:
        for c in range(chunks):
            m.write(line.format(c=c, n=chunk_size, t=chunk_size * seqlen, b=size, h=f"{c:064x}"))
    for c in range(chunks):
        with open(root / f"shard_{c:08}.tar", "wb") as f:
            f.truncate(size)
    meta = {
        "format_version": 1,
        "status": "complete",
        "seqlen": seqlen,
        "dtype": "uint16",
        "format": "npy",
        "chunk_size": chunk_size,
        "num_chunks": chunks,
        "num_contexts": chunks * chunk_size,
        "shuffle": True,
        "recipe": {"synthetic": chunks},
    }
    (root / "tokshuf.json").write_text(json.dumps(meta))


OPEN_SCRIPT = """
import resource, sys, time
import tokshuf
Cache = tokshuf.Cache  # imports NumPy: the import is not part of opening
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
w, c = time.perf_counter(), cpu()
cache = Cache(sys.argv[1], check_files=sys.argv[2] == "1")
w1, c1 = time.perf_counter(), cpu()
tokshuf.Reader(cache, batch_size=512).locate(10**12)
print(w1 - w, c1 - c, time.perf_counter() - w1)
"""


LIST_SCRIPT = """
import os, sys, time
w = time.perf_counter()
sum(1 for _ in os.scandir(sys.argv[1]))
print((time.perf_counter() - w) * 1e3)
"""


def bench_open(chunks: int, runs: int, tmp: Path, results: Dict) -> None:
    """Opening a cache of `chunks` chunks in a fresh process (interpreter start and import not
    counted), with the default checks and with check_files=False; and listing its folder alone,
    what the default check cannot go below."""
    import subprocess

    root = tmp / f"open{chunks}"
    t0 = time.perf_counter()
    make_synthetic(root, chunks, 8192, 2049)
    print(f"  (synthetic cache of {chunks:,} chunks written in {time.perf_counter() - t0:.1f} s)")
    for check in (True, False):
        got = []
        for _ in range(runs):
            out = subprocess.run(
                [sys.executable, "-c", OPEN_SCRIPT, str(root), "1" if check else "0"],
                capture_output=True,
                text=True,
                check=True,
            )
            got.append([float(x) * 1e3 for x in out.stdout.split()])
        wall, cpu, reader = (statistics.median(g[k] for g in got) for k in range(3))
        results[f"open {chunks} chunks check_files={check}"] = {"ms": wall, "cpu_ms": cpu, "reader_ms": reader}
        print(
            f"  open {chunks:,} chunks, check_files={check!s:<6}{wall:>8.1f} ms ({cpu:.1f} ms CPU); Reader + locate {reader:.1f} ms",
            flush=True,
        )
    listing = statistics.median(
        float(
            subprocess.run(
                [sys.executable, "-c", LIST_SCRIPT, str(root)], capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(runs)
    )
    results[f"list {chunks} chunks"] = {"ms": listing}
    print(f"  list the folder alone (os.scandir)   {listing:>8.1f} ms", flush=True)


FORMATS = ("npy", "json.gz", "blocks", "blocks.zst")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", help="existing cache to read (its format only)")
    ap.add_argument("--build", help="corpus folder to build one cache per format from (with --out)")
    ap.add_argument("--out", help="where --build writes the caches (reused when already built)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="formats --build makes and reads")
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--tokens", type=float, default=200e6, help="tokens per timed run")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per figure (median)")
    ap.add_argument("--dtypes", default="uint16,int32,int64", help="output dtypes")
    ap.add_argument(
        "--open-chunks", type=int, default=100_000, help="chunks of the cache opened in a fresh process (0: skip)"
    )
    ap.add_argument("--unpacked", help="an unpacked cache (packing='none') to read too (real ids per second)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check that the script runs")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    results: Dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="tokshuf-readbench-"))
    try:
        formats = args.formats.split(",")
        if args.smoke:
            from tests.support.corpus import make_docs, write_jsonl

            files = [write_jsonl(tmp / "in" / f"{k}.jsonl", make_docs(60, k)) for k in range(2)]
            paths = {}
            for fmt in formats:
                paths[fmt] = tmp / fmt
                blocks = dict(block_size=4) if fmt.startswith("blocks") else {}
                tokshuf.build_cache(files, paths[fmt], seqlen=64, chunk_size=16, format=fmt, progress=False, **blocks)
            args.unpacked = str(tmp / "unpacked")
            tokshuf.build_cache(files, args.unpacked, seqlen=64, packing="none", bin_size=16, progress=False)
            args.batch_size, args.tokens, args.runs, args.open_chunks = 8, 2e4, 1, 2000
        elif args.build:
            if not args.out:
                ap.error("--build needs --out")
            files = sorted(glob.glob(os.path.join(args.build, "**", "*.jsonl*"), recursive=True))
            paths = {}
            for fmt in formats:
                paths[fmt] = Path(args.out) / fmt.replace(".", "")
                tokshuf.build_cache(files, paths[fmt], seqlen=args.seqlen, format=fmt, progress=False)
        elif args.cache:
            c = tokshuf.Cache(args.cache)
            paths = {c.format: Path(args.cache)}
        else:
            ap.error("give --cache, --build or --smoke")
        caches = {fmt: tokshuf.Cache(p) for fmt, p in paths.items()}
        first = next(iter(caches.values()))
        tokens = int(args.tokens)
        print(f"{first!r}, batch {args.batch_size}, cpus {os.cpu_count()}, load average {os.getloadavg()}")
        print("bytes on disk:")
        bytes_per_token(caches, results)
        contexts = first[:]
        for dtype in args.dtypes.split(","):
            print(f"throughput, {dtype} batches (median of {args.runs}; warm unless marked cold):")
            bench_copy(contexts, args.batch_size, dtype, tokens, args.runs, results)
            bench_tokshuf(caches, contexts, args.batch_size, dtype, tokens, args.runs, results)
        print("other loaders, same contexts:")
        for fmt in ("npy", "blocks"):
            if fmt in caches:
                bench_webdataset(caches[fmt], args.batch_size, min(tokens, 20_000_000), args.runs, results)
        bench_streaming(contexts, args.batch_size, tokens, args.runs, results, tmp)
        bench_litdata(contexts, args.batch_size, tokens, args.runs, results, tmp)
        bench_blend(first, args.batch_size, tokens, args.runs, results)
        if args.unpacked:
            print("unpacked cache (real ids, padding not counted):")
            bench_unpacked(args.unpacked, args.batch_size, args.dtypes.split(","), tokens, args.runs, results)
        print("ratios to the NumPy copy (wall, then per CPU-s; tokshuf's: the median of the ratios of runs paired with")
        print("a copy run; the others: to the copy's own median):")
        for name, v in results.items():
            if isinstance(v, dict) and "mtok_per_s" in v and not name.startswith("numpy"):
                dtype = next((d for d in ("int64", "int32", "uint32") if d in name), "uint16")
                ref = results.get(f"numpy copy -> {dtype}")
                if "vs_copy_paired" in v:
                    v["vs_copy"], v["vs_copy_cpu"] = v["vs_copy_paired"], v["vs_copy_paired_cpu"]
                elif ref:
                    v["vs_copy"] = v["mtok_per_s"] / ref["mtok_per_s"]
                    v["vs_copy_cpu"] = v["mtok_per_cpu_s"] / ref["mtok_per_cpu_s"]
                else:
                    continue
                print(f"  {name:<46}{v['vs_copy']:>7.2f}x copy {v['vs_copy_cpu']:>7.2f}x", flush=True)
        print("seek:")
        bench_seek(first, args.batch_size, results)
        if args.open_chunks > 0:
            print("open (fresh process):")
            bench_open(args.open_chunks, args.runs, tmp, results)
        results["load_average_after"] = os.getloadavg()
        print(f"load average {os.getloadavg()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
