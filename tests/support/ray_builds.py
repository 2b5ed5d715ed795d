"""Builds with ``engine="ray"`` for the tests on the loopback cluster (support/ray_cluster.py):
a corpus, the engine's own entry with chosen task sizes, the local build to compare with, and a
driver in a subprocess to kill."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import tokshuf
from tokshuf import _ray

from .steps import same_tree

DATA = Path(__file__).resolve().parent.parent / "data"
SAMPLE = DATA / "sample"
NEOX = str(DATA / "gpt-neox-20b.json")
CL100K = "tiktoken:cl100k_base"


def sample_parts(root: Path) -> List[Path]:
    """Seven small input files (one gzip, one holding a single short document) cut from the
    sample corpus: enough files and chunks for several tasks per stage."""
    lines = (SAMPLE / "kjv.jsonl").read_text().splitlines(keepends=True)
    lines += (SAMPLE / "wordnet.jsonl").read_text().splitlines(keepends=True)
    files = []
    for k in range(6):
        part = "".join(lines[k::6]).encode()
        path = root / (f"part{k}.jsonl.gz" if k == 2 else f"part{k}.jsonl")
        path.write_bytes(gzip.compress(part, mtime=0) if k == 2 else part)
        files.append(path)
    files.append(root / "tiny.jsonl")
    files[-1].write_text(json.dumps({"text": "In the beginning."}) + "\n")
    return files


def local_build(inputs: Sequence[Any], out: Path, **opts: Any) -> Dict[str, Any]:
    return tokshuf.build_cache(inputs, out, progress=False, threads=1, **opts).metadata


def build_args(inputs: Sequence[Any], out: Any, **opts: Any) -> Dict[str, Any]:
    """The arguments of ``_ray.build`` (``_core.BuildSteps``'s) for ``opts``."""
    args = dict(
        inputs=sorted(str(p) for p in inputs),
        output=str(out),
        tokenizer=opts.pop("tokenizer", tokshuf.DEFAULT_TOKENIZER),
        seqlen=opts.pop("seqlen", 2049),
        chunk_size=opts.pop("chunk_size", 8192),
        num_local_cells=opts.pop("num_local_cells", None),
        local_cell_dir=opts.pop("local_cell_dir", None),
        seed=opts.pop("seed", 0),
        text_key="text",
        format=opts.pop("format", "npy"),
        block_size=opts.pop("block_size", None),
        tail=opts.pop("tail", "stitch"),
        eot_id=None,
        pad_id=None,
        bos=False,
        bos_id=None,
        allow_special_tokens=False,
        shuffle=opts.pop("shuffle", True),
        memory_limit=1 << 30,
        errors=opts.pop("errors", "raise"),
        overwrite=opts.pop("overwrite", False),
    )
    # Unpacked and shuffle-only builds' options, only when given (else build_cache's defaults).
    args.update({k: opts.pop(k) for k in ("packing", "bins", "bin_size", "shuffle_only") if k in opts})
    assert not opts, opts
    return args


def ray_build(
    inputs: Sequence[Any], out: Any, options: Optional[_ray.RayOptions] = None, **opts: Any
) -> Dict[str, Any]:
    """A Ray build through the engine's own entry, to choose task sizes."""
    return _ray.build(build_args(inputs, out, **opts), options or _ray.RayOptions(cpus_per_task=1), progress=False)


def assert_same_cache(a: Path, b: Path) -> None:
    """Every file byte-identical, tokshuf.json but its `build` key."""
    assert_same_files(a, {p.name: p.read_bytes() for p in b.iterdir()})


def assert_same_tree(a: Path, b: Path) -> None:
    """Every file at any depth (an unpacked cache's bin folders) byte-identical, tokshuf.json
    but its `build` key."""
    problem = same_tree(a, b)
    assert problem is None, problem


def assert_same_files(a: Path, files: Dict[str, bytes]) -> None:
    """The local cache ``a`` holds exactly ``files`` (name -> bytes), tokshuf.json but `build`."""
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(files)
    assert "manifest.jsonl" in names and any(n.endswith(".tar") for n in names)
    for name in names:
        if name == "tokshuf.json":
            ma, mb = json.loads((a / name).read_text()), json.loads(files[name])
            ma.pop("build"), mb.pop("build")
            assert ma == mb
        else:
            assert (a / name).read_bytes() == files[name], name


def build_losing_node(
    cluster: Any, node: Any, trace: Path, point: str, inputs: Sequence[Any], out: Any, **opts: Any
) -> Dict[str, Any]:
    """A Ray build (a file and a chunk per task) during which worker ``node`` is lost: until
    its first task has paused at testhook ``point`` (written to ``trace``), the other nodes'
    CPUs are held, so the node runs it whatever the scheduler prefers; then the node is
    removed. Returns the build's tokshuf.json (the build must succeed).

    The build's driver is a process of its own, as a user's would be: should Ray end it while
    the cluster loses the node, the test fails with what it printed, and the test session
    (Ray's driver that manages the cluster) goes on."""
    args = build_args(inputs, out, **opts)
    stdout, stderr = trace.with_name(trace.name + ".out"), trace.with_name(trace.name + ".err")
    with stdout.open("w") as o, stderr.open("w") as e:
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args), cluster.address], stdout=o, stderr=e)
    try:
        try:
            with cluster.only_on(node) as free_others:
                wait_for(trace, f"paused {point}", lambda: proc.poll() is None)
                free_others()
        finally:
            cluster.remove_worker(node)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"the driver exited {proc.returncode}:\n{stderr.read_text()[-3000:]}"
    return json.loads(stdout.read_text().splitlines()[-1])


def wait_for(path: Path, text: str, alive: Optional[Callable[[], bool]], timeout: float = 120.0) -> None:
    """Wait until ``text`` appears in the file ``path`` (a trace), while ``alive()`` holds."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared in {path}")
        if alive is not None and not alive():
            raise AssertionError(f"the build ended before {text!r}")
        time.sleep(0.05)


# A Ray driver in a subprocess (a test SIGKILLs it, or loses a node under it): it takes the build's
# arguments and the cluster's address, and prints the cache's tokshuf.json.
DRIVER = """
import json, sys
from tokshuf import _ray
args, address = json.loads(sys.argv[1]), sys.argv[2]
options = _ray.RayOptions(address=address, cpus_per_task=1, task_bytes=1, chunks_per_task=1)
print(json.dumps(_ray.build(args, options, progress=False)))
"""
