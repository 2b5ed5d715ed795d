"""The Ray engine's steps (``tokshuf._core.BuildSteps``) driven in this process, one call at a
time and in the order the engine runs them, without a cluster: each step's own behaviour, fast,
for any place the output is (a folder or an object-store prefix)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from tokshuf import _core

DEFAULTS: Dict[str, Any] = dict(
    tokenizer="tiktoken:r50k_base",
    seqlen=64,
    chunk_size=16,
    num_local_cells=3,
    local_cell_dir=None,
    seed=0,
    format="npy",
    tail="stitch",
    shuffle=True,
    errors="raise",
    overwrite=False,
)


def step_args(inputs: Sequence[Any], output: Any, **opts: Any) -> Dict[str, Any]:
    """The options of ``BuildSteps`` (``build_cache``'s), with small defaults."""
    args = dict(DEFAULTS, inputs=[str(p) for p in sorted(map(str, inputs))], output=str(output))
    args.update(opts)
    return args


def drive(
    args: Dict[str, Any], chunks_per_call: int = 2, files_per_call: int = 2, pause: float = 0.0
) -> Dict[str, Any]:
    """Every step, as the Ray driver calls them, each task's step on a fresh ``BuildSteps``
    made from the driver's recipe (as a worker would); ``pause`` seconds after each group of
    chunks is listed (a slow build, for a reader to follow). Returns tokshuf.json."""
    driver = _core.BuildSteps(**args)
    done = driver.begin(json.dumps({"engine": "steps"}))
    if done is not None:
        return json.loads(done)
    recipe = driver.recipe_json

    def task() -> Any:
        return _core.BuildSteps(recipe=recipe, **args)

    nfiles = len(driver.input_sizes())
    for files in batches(list(range(nfiles)), files_per_call):
        task().stage1(files, 1)
    num_chunks = driver.plan_chunks(1, "{}")
    bins = driver.bin_chunks()
    if bins is not None:  # unpacked: each bin's chunks, no regroup
        for k, n in enumerate(bins):
            for first in range(0, n, chunks_per_call):
                driver.add_bin_lines(k, first, task().stage2_bin(k, first, min(first + chunks_per_call, n), 1))
        return json.loads(driver.finish(json.dumps({"engine": "steps"})))
    nspills, regroup = driver.spills()
    if regroup:
        for files in batches(list(range(nspills)), files_per_call):
            task().regroup(files, 1)
    for first in range(driver.listed, num_chunks, chunks_per_call):
        last = min(first + chunks_per_call, num_chunks)
        driver.add_lines(first, task().stage2(first, last, 1))
        driver.upload_manifest(now=pause > 0)
        time.sleep(pause)
    return json.loads(driver.finish(json.dumps({"engine": "steps"})))


def batches(items: List[int], n: int) -> List[List[int]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


def tree_files(d: Path) -> Dict[str, bytes]:
    """Every file under ``d`` (an unpacked cache's bin folders too), by path relative to it."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def same_tree(a: Path, b: Path) -> Optional[str]:
    """None when the folders ``a`` and ``b`` hold the same files at any depth, byte for byte but
    tokshuf.json's ``build``; else the first difference."""
    fa, fb = tree_files(a), tree_files(b)
    if sorted(fa) != sorted(fb):
        return f"names differ: {sorted(fa)} != {sorted(fb)}"
    for name in fa:
        x, y = fa[name], fb[name]
        if name == "tokshuf.json":
            mx, my = json.loads(x), json.loads(y)
            mx.pop("build"), my.pop("build")
            x, y = json.dumps(mx).encode(), json.dumps(my).encode()
        if x != y:
            return f"{name} differs"
    return None


def same_files(a: Path, b: Dict[str, bytes], skip_build: bool = True) -> Optional[str]:
    """None when the local cache ``a`` holds exactly the files ``b`` (name -> bytes), with
    tokshuf.json equal but for ``build``; else the first difference."""
    names = sorted(p.name for p in a.iterdir())
    if names != sorted(b):
        return f"names differ: {names} != {sorted(b)}"
    for name in names:
        x, y = (a / name).read_bytes(), b[name]
        if name == "tokshuf.json" and skip_build:
            mx, my = json.loads(x), json.loads(y)
            mx.pop("build"), my.pop("build")
            if mx != my:
                return f"{name} differs"
        elif x != y:
            return f"{name} differs"
    return None
