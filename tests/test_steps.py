"""The Ray engine's steps without a cluster (support/steps.py drives them in this process):
the cache they make, into a folder or an object store, is the local engine's byte for byte;
a killed driver's build resumes; two writers of one shard (a task Ray gave up on that is still
running, and its retry) never share a temporary file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest
import tokshuf
from support.build import build
from support.corpus import parts, three_files
from support.s3 import S3, uploads
from support.steps import drive, same_files, same_tree, step_args
from tokshuf import _core

RECIPES = [
    pytest.param(dict(format="npy", tail="stitch", shuffle=True), id="npy-stitch-shuffled"),
    pytest.param(dict(format="json.gz", tail="pad", shuffle=True), id="json-pad-shuffled"),
    pytest.param(dict(format="npy", tail="stitch", shuffle=False), id="npy-stitch-ordered"),
    pytest.param(dict(format="json.gz", tail="drop", shuffle=False, packing="bestfit"), id="json-bestfit-ordered"),
]


def local_cache(inputs: List[Path], out: Path, args: Dict) -> Path:
    opts = {k: v for k, v in args.items() if k not in ("inputs", "output", "local_cell_dir", "overwrite")}
    build(inputs, out, threads=1, **opts)
    return out


def folder_files(d: Path) -> Dict[str, bytes]:
    return {p.name: p.read_bytes() for p in d.iterdir()}


def store_files(s3: S3, prefix: str) -> Dict[str, bytes]:
    return {k.rsplit("/", 1)[1]: s3.get(k) for k in s3.keys(prefix + "/")}


@pytest.fixture
def corpus(tmp_path: Path) -> List[Path]:
    return [*three_files(tmp_path / "in"), *parts(tmp_path / "in", 3, 5, 7, 40)]


@pytest.mark.parametrize("recipe", RECIPES)
def test_steps_into_a_folder_make_the_local_cache(corpus: List[Path], tmp_path: Path, recipe: Dict) -> None:
    args = step_args(corpus, tmp_path / "steps", **recipe)
    want = local_cache(corpus, tmp_path / "local", args)
    meta = drive(args, chunks_per_call=3, files_per_call=2)
    assert meta["num_chunks"] >= 4
    assert same_files(want, folder_files(tmp_path / "steps")) is None
    assert not (tmp_path / "steps" / ".tokshuf-work").exists()


@pytest.mark.parametrize("recipe", RECIPES[:3])
def test_steps_into_an_object_store_make_the_local_cache(
    s3: S3, corpus: List[Path], tmp_path: Path, recipe: Dict
) -> None:
    args = step_args(corpus, s3.url("caches/steps"), local_cell_dir=str(tmp_path / "scratch"), **recipe)
    want = local_cache(corpus, tmp_path / "local", args)
    proxy = s3.faults(seed=3, rate=0.2, kinds=("drop", "slowdown", "reset"))
    drive(args, chunks_per_call=3, files_per_call=2)
    assert sum(n for f, n in proxy.faults.items() if f != "ok") > 0
    s3.no_faults()
    # Nothing else in the store: no work objects, no temporary ones; no upload left open.
    assert same_files(want, store_files(s3, "caches/steps")) is None
    assert s3.keys("caches/steps/.tokshuf-work") == [] and s3.pending_uploads() == []
    # Scratch stays on local disk and is cleaned up step by step.
    assert not [p for p in (tmp_path / "scratch").rglob("*") if p.is_file()]


def test_killed_driver_resumes_in_the_store_without_redoing_finished_work(
    s3: S3, corpus: List[Path], tmp_path: Path
) -> None:
    args = step_args(corpus, s3.url("caches/resume"), local_cell_dir=str(tmp_path / "scratch"), format="json.gz")
    want = local_cache(corpus, tmp_path / "local", args)
    # A driver that got through stage 1, the plan, the regroup and two chunks, then died.
    first = _core.BuildSteps(**args)
    assert first.begin("{}") is None
    n = len(first.input_sizes())
    first.stage1(list(range(n)), 1)
    chunks = first.plan_chunks(1, "{}")
    first.regroup(list(range(first.spills()[0])), 1)
    first.add_lines(0, first.stage2(0, 2, 1))
    first.upload_manifest(now=True)
    first.release()  # it gives up its lease, as a driver stopped by an error does
    meta = json.loads(s3.get("caches/resume/tokshuf.json"))
    assert meta["status"] == "writing" and meta["num_chunks"] == chunks
    assert s3.get("caches/resume/manifest.jsonl").count(b"\n") == 2
    # The next driver finds every file tokenized and two chunks listed.
    again = _core.BuildSteps(**args)
    assert again.begin("{}") is None
    assert again.files_done() == list(range(n)) and again.listed == 2
    again.release()
    proxy = s3.faults(seed=0, rate=0.0)
    drive(args)
    put = {t.split("?")[0].rsplit("/", 1)[1] for m, t, _ in proxy.log if uploads(m, t)}
    assert not any(p.endswith((".ctx", ".cells")) for p in put), "stage 1 or the regroup was redone"
    assert "shard_00000000.tar" not in put and "shard_00000001.tar" not in put
    s3.no_faults()
    assert same_files(want, store_files(s3, "caches/resume")) is None


def test_s3_inputs_into_s3_output(s3: S3, corpus: List[Path], tmp_path: Path) -> None:
    for f in corpus:
        s3.put(f"corpus/{f.name}", f.read_bytes())
    inputs = [s3.url(f"corpus/{f.name}") for f in corpus]
    args = step_args(inputs, s3.url("caches/both"), local_cell_dir=str(tmp_path / "scratch"))
    drive(args)
    local_args = step_args(corpus, tmp_path / "local")
    want = local_cache(corpus, tmp_path / "local", local_args)
    got = store_files(s3, "caches/both")
    for name, data in got.items():
        if name != "tokshuf.json":
            assert data == (want / name).read_bytes(), name
    assert (
        json.loads(got["tokshuf.json"])["num_contexts"]
        == json.loads((want / "tokshuf.json").read_text())["num_contexts"]
    )


UNPACKED = dict(packing="none", seqlen=64, chunk_size=4, tail="pad")


@pytest.mark.parametrize("bins", [[8, 24, 64], None], ids=["bins", "default-bins"])
def test_unpacked_steps_make_the_local_cache(corpus: List[Path], tmp_path: Path, bins: Optional[List[int]]) -> None:
    """packing="none": each bin's chunks written in ranges by fresh steps (as tasks), every bin's
    manifest and tokshuf.json by the driver: every file the local engine's."""
    args = step_args(corpus, tmp_path / "steps", bins=bins, **UNPACKED)
    local_cache(corpus, tmp_path / "local", args)
    meta = drive(args, chunks_per_call=3)
    assert len(meta["bins"]) > 2 and max(b["num_chunks"] for b in meta["bins"]) > 3
    assert same_tree(tmp_path / "local", tmp_path / "steps") is None
    assert not (tmp_path / "steps" / ".tokshuf-work").exists()


def test_unpacked_steps_refuse_an_object_store_output(tmp_path: Path, corpus: List[Path]) -> None:
    args = step_args(corpus, "s3://bucket/cache", **UNPACKED)
    with pytest.raises(tokshuf.ConfigError, match="not into an object store"):
        _core.BuildSteps(**args)


def test_a_node_with_another_tokenizer_or_version_is_refused(tmp_path: Path, corpus: List[Path]) -> None:
    args = step_args(corpus, tmp_path / "out")
    shipped = json.loads(_core.BuildSteps(**args).recipe_json)
    recipe = shipped["recipe"]
    other = dict(recipe, tokenizer=dict(recipe["tokenizer"], sha256="0" * 64))
    with pytest.raises(tokshuf.ConfigError, match="same tokenizer file"):
        _core.BuildSteps(recipe=json.dumps(dict(shipped, recipe=other)), **args)
    other = dict(recipe, tokshuf_version="0.0.1")
    with pytest.raises(tokshuf.ConfigError, match=r"the driver 0\.0\.1: install the same version"):
        _core.BuildSteps(recipe=json.dumps(dict(shipped, recipe=other)), **args)


WRITER = """
import json, sys
from tokshuf import _core
args, first, last = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print(json.dumps(list(_core.BuildSteps(**args).stage2(first, last, 1))))
"""


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_writers_of_one_shard_never_share_a_temporary_file(
    corpus: List[Path], tmp_path: Path, shuffle: bool
) -> None:
    """Writer A stops with its first shard written whole under its temporary name, not yet
    renamed; writer B meanwhile writes every shard, that one included. A's file is untouched
    (B used its own name), holds the same bytes, and A's rename lands on an identical shard."""
    out = tmp_path / "out"
    args = step_args(corpus, out, shuffle=shuffle, format="json.gz")
    want = local_cache(corpus, tmp_path / "local", args)
    steps = _core.BuildSteps(**args)
    assert steps.begin("{}") is None
    steps.stage1(list(range(len(steps.input_sizes()))), 1)
    chunks = steps.plan_chunks(1, "{}")
    steps.regroup(list(range(steps.spills()[0])), 1)
    gate, trace = tmp_path / "gate", tmp_path / "trace"
    env = dict(os.environ, TOKSHUF_TEST_GATE=f"stage2.tmp:{gate}", TOKSHUF_TEST_TRACE=str(trace))
    a = subprocess.Popen(
        [sys.executable, "-c", WRITER, json.dumps(args), "0", str(chunks)], env=env, stdout=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not (trace.exists() and "gate stage2.tmp" in trace.read_text()):
            assert a.poll() is None and time.monotonic() < deadline, "writer A never reached its temporary file"
            time.sleep(0.02)
        (a_tmp,) = out.glob("shard_*.tar.tmp.*")
        lines = list(steps.stage2(0, chunks, 1))
        final = out / a_tmp.name.split(".tmp.")[0]
        assert a_tmp.exists() and a_tmp.read_bytes() == final.read_bytes()
        assert not list(out.glob("*.tmp")), "a shared temporary name"
    finally:
        gate.touch()
        got, _ = a.communicate(timeout=120)
    assert a.returncode == 0
    assert json.loads(got) == lines
    steps.add_lines(0, lines)
    steps.finish("{}")
    assert same_files(want, folder_files(out)) is None
