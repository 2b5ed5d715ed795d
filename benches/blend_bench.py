"""Blend construction and lookup: tokshuf's periodic schedule vs Megatron's index arrays.

tokshuf: build the schedule of N components (one period of D draws, O((D + n) log n)), then
locate random blended examples in O(1) each, anywhere in an endless run.

Megatron (BlendableDataset / BlendedDataset): `build_blending_indices` fills two arrays with
one entry per blended sample of the whole run (int16 dataset id + int64 sample id), choosing
at each sample the argmax of `weight_i * max(sample_idx, 1) - count_i` (its off-by-one form:
the first two samples use the same target), a scan over all datasets per sample. Below is a
faithful NumPy rewrite of that loop (argmax keeps the first maximum, like its strict `>`);
if megatron-core's compiled helper can be imported, it is timed too.

    python -m benches.blend_bench                       # 10,000 components, 10^6 lookups
    python -m benches.blend_bench --components 100 --lookups 1000 --samples 10000   # smoke

Prints one JSON object. Timings on a busy machine mean little: run on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import tokshuf
from tokshuf._core import BlendSchedule


def megatron_build_blending_indices(weights: np.ndarray, size: int):
    """NumPy rewrite of Megatron's build_blending_indices loop (same rule, same outputs)."""
    weights = np.asarray(weights, dtype=np.float64)
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    current = np.zeros(len(weights), dtype=np.float64)
    err = np.empty_like(current)
    for sample_idx in range(size):
        x = max(float(sample_idx), 1.0)
        np.multiply(weights, x, out=err)
        np.subtract(err, current, out=err)
        k = int(np.argmax(err))
        dataset_index[sample_idx] = k  # int16: wraps past 32767 datasets (uint8 in older versions)
        dataset_sample_index[sample_idx] = int(current[k])
        current[k] += 1.0
    return dataset_index, dataset_sample_index


def megatron_cpp(weights: np.ndarray, size: int):
    """megatron-core's compiled helper, when it is installed and built; else None."""
    try:
        from megatron.core.datasets import helpers  # type: ignore
    except Exception:
        return None
    dataset_index = np.zeros(size, dtype=np.int16)
    dataset_sample_index = np.zeros(size, dtype=np.int64)
    fn = helpers.build_blending_indices
    try:
        fn(dataset_index, dataset_sample_index, weights, len(weights), size, False)
    except TypeError:  # newer signature without the size/verbose arguments
        fn(dataset_index, dataset_sample_index, weights)
    return dataset_index, dataset_sample_index


def timed(fn, *args, repeat=1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn(*args)
        best = min(best, time.perf_counter() - t)
    return best, out


def fake_caches(root: Path, sizes) -> list:
    """Caches of one chunk each with tokshuf.json and manifest but no shards, opened without
    the shard stat (a Blend opens every component as a tokshuf.Cache)."""
    tok = {"spec": "tiktoken:r50k_base", "sha256": "ab" * 32, "vocab_size": 50257, "backend": "tiktoken"}
    paths = []
    for i, n in enumerate(sizes):
        d = root / f"c{i:05d}"
        d.mkdir()
        meta = {
            "format_version": 1,
            "status": "complete",
            "seqlen": 2049,
            "dtype": "uint16",
            "format": "npy",
            "chunk_size": int(n),
            "num_chunks": 1,
            "num_contexts": int(n),
            "recipe": {},
            "tokenizer": tok,
        }
        (d / "tokshuf.json").write_text(json.dumps(meta))
        (d / "manifest.jsonl").write_text(json.dumps({"shard": "shard_00000000", "num_sequences": int(n)}) + "\n")
        paths.append(d)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--components", type=int, default=10_000)
    ap.add_argument("--lookups", type=int, default=1_000_000)
    ap.add_argument(
        "--samples",
        type=int,
        default=1_000_000,
        help="length of the run Megatron materialises (its index arrays); lookups fall in it",
    )
    ap.add_argument("--quantum", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-megatron", action="store_true")
    args = ap.parse_args()

    rng = np.random.default_rng(args.seed)
    n = args.components
    weights = rng.lognormal(0.0, 1.0, n)
    sizes = rng.integers(1_000, 100_000, n)
    ms = rng.integers(0, args.samples, args.lookups, dtype=np.uint64)
    out = {"components": n, "lookups": args.lookups, "samples": args.samples, "quantum": args.quantum}

    t_sched, sched = timed(BlendSchedule, list(weights), args.quantum, repeat=3)
    out["tokshuf_schedule_build_s"] = t_sched
    out["tokshuf_schedule_bytes"] = 12 * args.quantum + 8 * n
    out["tokshuf_max_lag"] = sched.max_lag
    out["tokshuf_raised"] = len(sched.raised)
    t_many, _ = timed(sched.locate_many, ms, repeat=3)
    out["tokshuf_locate_many_s"] = t_many
    t_wrap, _ = timed(sched.locate_many, ms, sizes.astype(np.uint64), repeat=3)
    out["tokshuf_locate_many_single_pass_s"] = t_wrap
    few = ms[: min(len(ms), 100_000)].tolist()
    t_scalar, _ = timed(lambda: [sched.locate(m) for m in few])
    out["tokshuf_locate_scalar_us"] = 1e6 * t_scalar / max(len(few), 1)

    with tempfile.TemporaryDirectory() as tmp:
        paths = fake_caches(Path(tmp), sizes)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_blend, blend = timed(
                lambda: tokshuf.Blend(
                    [(tokshuf.Cache(p, check_files=False), w) for p, w in zip(paths, weights)], quantum=args.quantum
                )
            )
        out["tokshuf_blend_build_s"] = t_blend  # includes opening n caches (tokshuf.json + manifest)
        t_bl, _ = timed(blend.locate_many, ms)
        out["tokshuf_blend_locate_many_s"] = t_bl

    if not args.skip_megatron:
        norm = weights / weights.sum()
        t_meg, (di, dsi) = timed(megatron_build_blending_indices, norm, args.samples)
        out["megatron_numpy_build_s"] = t_meg
        out["megatron_index_bytes"] = int(di.nbytes + dsi.nbytes)
        t_look, _ = timed(lambda: (di[ms.astype(np.int64)], dsi[ms.astype(np.int64)]), repeat=3)
        out["megatron_lookup_s"] = t_look
        over = dsi >= sizes[di.astype(np.int64) % n]
        out["megatron_out_of_range_samples"] = int(over.sum())
        cpp = timed(megatron_cpp, norm, args.samples)
        if cpp[1] is not None:
            out["megatron_cpp_build_s"] = cpp[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
