"""Object-store throughput against a local S3 server (moto, on 127.0.0.1) next to local files.

    python -m benches.remote_bench [--inputs GLOB | --synthetic-mb N] [--work DIR] [--seqlen N] [--chunk-size N]

One run, same data both ways, ratios printed:
- streaming read of the input files (raw and decompressed) from S3 vs the local files;
- publishing a cache (whole-object uploads, multipart above one part) vs copying it locally;
- fetching a cache's shards into a local shard cache, cold (every byte over the network)
  and warm (already on disk).
- a build from s3:// inputs vs the same build from local files;
- one epoch of tokshuf.Reader over the local cache, and over the published copy through
  tokshuf.Cache("s3://...", cache_dir=...), cold (empty cache_dir) and warm.
moto is a Python server: its own speed bounds the S3 figures,
so they are a floor for a real endpoint, not a measurement of one.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
import time

import boto3
import tokshuf
from moto.server import ThreadedMotoServer
from tokshuf import _core

from benches.corpus import corpus


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def synthetic(work: str, mb: int) -> list:
    """Eight jsonl files of pseudo-random words, ``mb`` MB in all."""
    import json
    import random

    rng = random.Random(0)
    words = [rng.randbytes(rng.randint(2, 8)).hex() for _ in range(5000)]
    out = []
    for i in range(8):
        path = os.path.join(work, "in", f"part-{i:02d}.jsonl")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            while f.tell() < mb * 1e6 / 8:
                f.write(json.dumps({"text": " ".join(rng.choices(words, k=300))}) + "\n")
        out.append(path)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--inputs",
        default=str(corpus("subset100m", "jsonl") / "*"),
        help="glob of input files (default: the corpus subset)",
    )
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--seqlen", type=int, default=2049)
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--synthetic-mb", type=int, default=0, help="generate this many MB of jsonl instead")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="tokshuf-remote-bench-")
    os.makedirs(work, exist_ok=True)
    files = synthetic(work, args.synthetic_mb) if args.synthetic_mb else sorted(glob.glob(args.inputs))
    if not files:
        raise SystemExit(f"no inputs match {args.inputs}")

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint
    )
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="bench")
    try:
        total = sum(os.path.getsize(f) for f in files)
        print(f"{len(files)} input files, {total / 1e6:.1f} MB")
        urls = [f"s3://bench/in/{i:05d}-{os.path.basename(f)}" for i, f in enumerate(files)]

        def upload() -> None:
            for f, u in zip(files, urls):
                _core._storage_put(f, u)

        t_up, _ = timed(upload)
        print(f"upload inputs:        {total / t_up / 1e6:8.1f} MB/s")
        for decompress in (False, True):
            t_local, n_local = timed(lambda d=decompress: sum(len(_core._storage_read(f, decompress=d)) for f in files))
            t_s3, n_s3 = timed(lambda d=decompress: sum(len(_core._storage_read(u, decompress=d)) for u in urls))
            assert n_local == n_s3
            what = "decoded" if decompress else "raw"
            print(
                f"read inputs ({what:7}): local {n_local / t_local / 1e6:8.1f} MB/s, "
                f"s3 {n_s3 / t_s3 / 1e6:8.1f} MB/s, ratio s3/local {t_s3 / t_local:5.2f}x time"
            )

        cache = os.path.join(work, "cache")
        t_build, _ = timed(
            lambda: tokshuf.build_cache(files, cache, seqlen=args.seqlen, chunk_size=args.chunk_size, progress=False)
        )
        size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(cache, "*")))
        print(f"local build:          {t_build:8.1f} s ({size / 1e6:.1f} MB of cache)")
        t_copy, _ = timed(lambda: shutil.copytree(cache, os.path.join(work, "copy"), dirs_exist_ok=True))
        t_pub, _ = timed(lambda: _core._storage_publish(cache, "s3://bench/cache"))
        print(
            f"publish cache:        {size / t_pub / 1e6:8.1f} MB/s to s3, {size / t_copy / 1e6:8.1f} MB/s local copy, "
            f"ratio {t_pub / t_copy:5.2f}x time"
        )
        t_s3build, _ = timed(
            lambda: tokshuf.build_cache(
                "s3://bench/in",
                os.path.join(work, "from_s3"),
                seqlen=args.seqlen,
                chunk_size=args.chunk_size,
                progress=False,
            )
        )
        print(f"build from s3 inputs: {t_s3build:8.1f} s, ratio to local inputs {t_s3build / t_build:5.2f}x time")
        n = len(tokshuf.Cache(cache))
        steps = max(1, n // 64)

        def read_all(c: tokshuf.Cache) -> None:
            r = tokshuf.Reader(c, batch_size=64, seed=1)
            for _ in range(steps):
                next(r)

        t_lread, _ = timed(lambda: read_all(tokshuf.Cache(cache)))
        rc = os.path.join(work, "remote-cache")
        t_cold, _ = timed(lambda: read_all(tokshuf.Cache("s3://bench/cache", cache_dir=rc)))
        t_warm, _ = timed(lambda: read_all(tokshuf.Cache("s3://bench/cache", cache_dir=rc)))
        print(
            f"reader, one epoch:    local {n / t_lread:10.0f} ctx/s, remote cold {n / t_cold:10.0f} ctx/s, "
            f"remote warm {n / t_warm:10.0f} ctx/s"
        )
        shards = sorted(os.path.basename(p) for p in glob.glob(os.path.join(cache, "shard_*.tar")))
        t_cold, _ = timed(lambda: [_core._storage_read(f"s3://bench/cache/{s}") for s in shards])
        t_warm, _ = timed(lambda: [_core._storage_read(os.path.join(cache, s)) for s in shards])
        print(
            f"shard fetch:          cold (s3) {size / t_cold / 1e6:8.1f} MB/s, warm (local) {size / t_warm / 1e6:8.1f} MB/s"
        )
    finally:
        server.stop()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
