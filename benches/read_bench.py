"""Reader benchmarks (issue 3): tokens/s delivered as NumPy batches by tokshuf's Reader versus
stock webdataset on the same tars (and mosaicml-streaming / litdata when installed), the same for
a blend of the cache with itself, seek time to step 1 and step 10^9, and the time to open a cache
of 100,000 chunks.

    python -m benches.read_bench --cache CACHE            # an existing cache (e.g. built from
                                                          # /work/corpus/out/subset100m)
    python -m benches.read_bench --build /work/corpus/out/subset100m --out /tmp/bench_cache
    python -m benches.read_bench --smoke                  # tiny, seconds: checks the script runs

Page cache warm (every reader first reads the data once), one consuming Python thread. Results
are printed as a table and, with --json PATH, written as JSON.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import numpy as np
import tokshuf


def measure(name: str, batches: Callable[[], Iterator[np.ndarray]], seconds: float, results: Dict) -> None:
    """Tokens/s of an iterator of 2-D batches, after one warm-up pass over `seconds`."""
    for _pass in ("warm", "timed"):
        t0 = time.perf_counter()
        tokens = nb = 0
        for b in batches():
            tokens += b.size
            nb += 1
            if time.perf_counter() - t0 > seconds:
                break
        dt = time.perf_counter() - t0
    rate = tokens / dt / 1e6
    results[name] = {"mtok_per_s": rate, "batches": nb, "seconds": dt}
    print(f"  {name:<32}{rate:>10.1f} Mtok/s  ({nb} batches in {dt:.2f} s)", flush=True)


def bench_tokshuf(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict) -> None:
    for dtype in (str(cache.dtype), "int32"):
        for threads in (1, 2, 4):

            def run(dtype=dtype, threads=threads):
                return iter(tokshuf.Reader(cache, batch_size=batch, dtype=dtype, prefetch=2 * threads, threads=threads))

            measure(f"tokshuf {dtype} threads={threads}", run, seconds, results)


def bench_blend(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict) -> None:
    """The same cache read as a 70/30 blend of itself: the cost of the blend path (schedule
    lookup, rows from two caches) against the single-cache rows above; and seek in a blend."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "listed twice"
        blend = tokshuf.Blend([(cache, 0.7), (tokshuf.Cache(cache.path), 0.3)])
    for threads in (1, 4):

        def run(threads=threads):
            return iter(tokshuf.Reader(blend, batch_size=batch, dtype="int32", prefetch=2 * threads, threads=threads))

        measure(f"tokshuf blend int32 threads={threads}", run, seconds, results)
    r = tokshuf.Reader(blend, batch_size=batch, prefetch=0)
    for step in (1, 10**9):
        r.seek(step=step)
        next(r)
        reps = 200
        t0 = time.perf_counter()
        for _ in range(reps):
            r.seek(step=step)
            next(r)
        ms = (time.perf_counter() - t0) / reps * 1e3
        results[f"blend seek+batch step {step}"] = {"ms": ms}
        print(f"  blend seek+batch to step {step:<12}{ms:>10.3f} ms", flush=True)


def bench_webdataset(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict) -> None:
    try:
        import webdataset as wds
    except ImportError:
        print("  webdataset not installed: skipped")
        return
    shards = sorted(glob.glob(os.path.join(cache.path, "shard_*.tar")))
    key = "npy" if cache.format == "npy" else "json.gz"

    def run():
        ds = wds.WebDataset(shards, shardshuffle=False).decode()
        rows: List[np.ndarray] = []
        for sample in ds:
            rows.append(np.asarray(sample[key]))
            if len(rows) == batch:
                yield np.stack(rows)
                rows = []

    measure("webdataset (stock, .decode())", run, seconds, results)


def bench_streaming(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict, tmp: Path) -> None:
    try:
        from streaming import MDSWriter, StreamingDataset
    except ImportError:
        print("  mosaicml-streaming not installed: skipped")
        return
    out = tmp / "mds"
    n = min(len(cache), 200_000)
    with MDSWriter(out=str(out), columns={"tokens": f"ndarray:{cache.dtype.name}:{cache.seqlen}"}) as w:
        for start in range(0, n, 4096):
            for row in cache.get_batch(range(start, min(n, start + 4096))):
                w.write({"tokens": row})

    def run():
        ds = StreamingDataset(local=str(out), batch_size=batch, shuffle=False)
        rows = []
        for s in ds:
            rows.append(s["tokens"])
            if len(rows) == batch:
                yield np.stack(rows)
                rows = []

    measure("mosaicml-streaming (MDS)", run, seconds, results)


def bench_litdata(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict, tmp: Path) -> None:
    try:
        import litdata
        from litdata.streaming.item_loader import TokensLoader
    except ImportError:
        print("  litdata not installed: skipped")
        return
    out = tmp / "litdata"
    n = min(len(cache), 200_000)
    import torch

    def rows(i):
        return torch.from_numpy(cache[i].astype(np.int64))

    litdata.optimize(
        fn=rows,
        inputs=list(range(n)),
        output_dir=str(out),
        chunk_bytes="64MB",
        item_loader=TokensLoader(),
        num_workers=1,
    )

    def run():
        ds = litdata.StreamingDataset(str(out), item_loader=TokensLoader(block_size=cache.seqlen))
        buf = []
        for s in ds:
            buf.append(s.numpy())
            if len(buf) == batch:
                yield np.stack(buf)
                buf = []

    measure("litdata TokensLoader", run, seconds, results)


def bench_memcpy(cache: tokshuf.Cache, batch: int, seconds: float, results: Dict) -> None:
    src = np.zeros((batch * 8, cache.seqlen), dtype=cache.dtype)
    dst = np.empty((batch, cache.seqlen), dtype=cache.dtype)

    def run():
        k = 0
        while True:
            np.copyto(dst, src[(k % 8) * batch : (k % 8 + 1) * batch])
            k += 1
            yield dst

    measure(f"memory copy ({cache.dtype})", run, seconds, results)


def bench_seek(cache: tokshuf.Cache, batch: int, results: Dict) -> None:
    r = tokshuf.Reader(cache, batch_size=batch, prefetch=0)
    for step in (1, 10**9):
        for what, fn in (
            ("locate", lambda s=step: r.locate(s * batch)),
            ("seek+batch", lambda s=step: (r.seek(step=s), next(r))),
        ):
            fn()
            reps = 200
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            ms = (time.perf_counter() - t0) / reps * 1e3
            results[f"{what} step {step}"] = {"ms": ms}
            print(f"  {what} to step {step:<12}{ms:>10.3f} ms", flush=True)


def make_synthetic(root: Path, chunks: int, chunk_size: int, seqlen: int) -> None:
    """A cache of `chunks` sparse shards (right sizes, no data): what opening has to check."""
    root.mkdir(parents=True, exist_ok=True)
    stride = 512 + -(-(128 + 2 * seqlen) // 512) * 512
    size = chunk_size * stride + 1024
    with open(root / "manifest.jsonl", "w") as m:
        for c in range(chunks):
            m.write(
                json.dumps(
                    {
                        "shard": f"shard_{c:08}",
                        "num_sequences": chunk_size,
                        "num_tokens": chunk_size * seqlen,
                        "bytes": size,
                        "sha256": "0" * 64,
                    }
                )
                + "\n"
            )
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


def bench_open(chunks: int, tmp: Path, results: Dict) -> None:
    root = tmp / f"open{chunks}"
    t0 = time.perf_counter()
    make_synthetic(root, chunks, 8192, 2049)
    print(f"  (synthetic cache of {chunks:,} chunks written in {time.perf_counter() - t0:.1f} s)")
    tokshuf.Cache(root)  # warm the dentry cache, as a second run would
    for check in (True, False):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            c = tokshuf.Cache(root, check_files=check)
            times.append(time.perf_counter() - t0)
        assert c.num_chunks == chunks
        results[f"open {chunks} chunks check_files={check}"] = {"ms": min(times) * 1e3}
        print(f"  open {chunks:,} chunks, check_files={check!s:<6}{min(times) * 1e3:>10.1f} ms", flush=True)
    t0 = time.perf_counter()
    r = tokshuf.Reader(c, batch_size=512)
    r.locate(10**12)
    print(f"  Reader construction + locate      {(time.perf_counter() - t0) * 1e3:>10.1f} ms")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", help="existing cache to read")
    ap.add_argument("--build", help="corpus folder to build a cache from (with --out)")
    ap.add_argument("--out", help="where --build writes the cache")
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    ap.add_argument("--open-chunks", type=int, default=100_000)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check that the script runs")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    results: Dict = {}
    tmp = Path(tempfile.mkdtemp(prefix="tokshuf-readbench-"))
    try:
        if args.smoke:
            from tests.support.corpus import make_docs, write_jsonl

            files = [write_jsonl(tmp / "in" / f"{k}.jsonl", make_docs(60, k)) for k in range(2)]
            tokshuf.build_cache(files, tmp / "cache", seqlen=64, chunk_size=16, progress=False)
            path, args.batch_size, args.seconds, args.open_chunks = tmp / "cache", 8, 0.2, 2000
        elif args.build:
            if not args.out:
                ap.error("--build needs --out")
            files = sorted(glob.glob(os.path.join(args.build, "**", "*.jsonl*"), recursive=True))
            tokshuf.build_cache(files, args.out, seqlen=args.seqlen)
            path = Path(args.out)
        elif args.cache:
            path = Path(args.cache)
        else:
            ap.error("give --cache, --build or --smoke")
        cache = tokshuf.Cache(path)
        print(f"{cache!r}, {cache.format}, batch {args.batch_size}, cpus {os.cpu_count()}")
        print("throughput (page cache warm, one consuming thread):")
        bench_tokshuf(cache, args.batch_size, args.seconds, results)
        bench_blend(cache, args.batch_size, args.seconds, results)
        bench_webdataset(cache, args.batch_size, args.seconds, results)
        bench_streaming(cache, args.batch_size, args.seconds, results, tmp)
        bench_litdata(cache, args.batch_size, args.seconds, results, tmp)
        bench_memcpy(cache, args.batch_size, args.seconds, results)
        print("seek:")
        bench_seek(cache, args.batch_size, results)
        print("open:")
        bench_open(args.open_chunks, tmp, results)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
