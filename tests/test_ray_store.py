"""engine="ray" with an object store, on the loopback cluster and the loopback S3 server (both
started here, both on 127.0.0.1): inputs, output or both in s3://, through the fault proxy; a
node lost mid-upload and a killed driver. The cache is the local engine's, byte for byte, and
nothing partial is ever left in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from support.ray_builds import (
    CL100K,
    DRIVER,
    NEOX,
    assert_same_files,
    build_args,
    build_losing_node,
    local_build,
    ray_build,
    sample_parts,
    wait_for,
)
from support.ray_cluster import LocalCluster, local_cluster  # sets Ray's loopback environment, then imports it
from support.s3 import S3, shared_bucket
from tokshuf import _ray

pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
pytest.importorskip("boto3")

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


@pytest.fixture(scope="module")
def store(moto_server: Tuple[str, int]) -> Iterator[S3]:
    with shared_bucket(moto_server) as b:
        yield b


@pytest.fixture(scope="module")
def cluster(store: S3) -> Iterator[LocalCluster]:
    """Started once the store's environment is set, so every node's processes have it, as the
    nodes of a real cluster get theirs (set when `ray start` runs, or an instance role)."""
    with local_cluster(workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def corpus(store: S3, tmp_path_factory: pytest.TempPathFactory) -> Tuple[List[Path], List[str]]:
    """The sample parts on local disk, and the same files in the store."""
    files = sample_parts(tmp_path_factory.mktemp("corpus"))
    return files, [store.put(f"corpus/{f.name}", f.read_bytes()) for f in files]


def store_files(s3: S3, prefix: str) -> Dict[str, bytes]:
    return {k[len(prefix) + 1 :]: s3.get(k) for k in s3.keys(prefix + "/")}


def without_input_names(files: Dict[str, bytes]) -> Dict[str, bytes]:
    """tokshuf.json with each input named by its file name only (a build from s3:// records the
    URLs); the other files as they are."""
    meta = json.loads(files["tokshuf.json"])
    for key in ("inputs",):
        for f in meta.get(key, []):
            f["path"] = f["path"].rsplit("/", 1)[-1]
    for f in meta["recipe"]["inputs"]:
        f["path"] = f["path"].rsplit("/", 1)[-1]
    return {**files, "tokshuf.json": json.dumps(meta).encode()}


def local_reference(files: List[Path], out: Path, **opts: Any) -> Path:
    local_build(files, out, **opts)
    named = without_input_names({p.name: p.read_bytes() for p in out.iterdir()})
    (out / "tokshuf.json").write_bytes(named["tokshuf.json"])
    return out


RECIPES = [
    pytest.param(dict(tokenizer=NEOX, format="npy", tail="stitch", shuffle=True), id="neox-npy-stitch-shuffled"),
    pytest.param(dict(tokenizer=CL100K, format="json.gz", tail="pad", shuffle=False), id="cl100k-json-pad-ordered"),
]


@pytest.mark.parametrize("recipe", RECIPES)
def test_store_inputs_into_a_store_output_are_the_local_cache(
    cluster: LocalCluster, store: S3, corpus: Tuple[List[Path], List[str]], tmp_path: Path, recipe: Dict[str, Any]
) -> None:
    files, urls = corpus
    opts = dict(recipe, seqlen=128, chunk_size=32, num_local_cells=5, seed=3)
    want = local_reference(files, tmp_path / "local", **opts)
    prefix = f"caches/{recipe['format']}-{recipe['shuffle']}"
    proxy = store.faults(seed=11, rate=0.1, kinds=("drop", "slowdown", "reset"))
    options = _ray.RayOptions(cpus_per_task=1, task_bytes=1, chunks_per_task=2)
    got = ray_build(urls, store.url(prefix), options, local_cell_dir=str(tmp_path / "scratch"), **opts)
    faults = sum(n for f, n in proxy.faults.items() if f != "ok")
    store.no_faults()
    assert faults > 0
    # Exactly the cache's objects: no work folder, no temporary object, no upload left open.
    assert_same_files(want, without_input_names(store_files(store, prefix)))
    assert store.pending_uploads() == []
    b = got["build"]
    assert (b["engine"], b["nodes"], b["cpus"]) == ("ray", 3, 3)
    assert b["tasks"]["tokenize"] == len(files) and b["tasks"].get("regroup", 0) == (
        len(files) + 1 if opts["shuffle"] else 0
    )
    assert not [p for p in (tmp_path / "scratch").rglob("*") if p.is_file()]


def test_store_inputs_into_a_shared_folder(
    cluster: LocalCluster, corpus: Tuple[List[Path], List[str]], tmp_path: Path
) -> None:
    files, urls = corpus
    opts = dict(tokenizer=CL100K, seqlen=256, chunk_size=16, num_local_cells=3)
    want = local_reference(files, tmp_path / "local", **opts)
    ray_build(urls, tmp_path / "ray", _ray.RayOptions(cpus_per_task=1, task_bytes=1), **opts)
    assert_same_files(want, without_input_names({p.name: p.read_bytes() for p in (tmp_path / "ray").iterdir()}))


def test_node_lost_mid_upload(
    cluster: LocalCluster,
    store: S3,
    corpus: Tuple[List[Path], List[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fourth node stops for good with a shard written in its scratch folder, not yet
    uploaded, and is removed: the task is retried elsewhere and the store holds exactly the
    cache (the lost node's scratch is on its own disk, gone with it)."""
    files, urls = corpus
    opts = dict(tokenizer=NEOX, seqlen=128, chunk_size=32, num_local_cells=4, tail="pad")
    want = local_reference(files, tmp_path / "local", **opts)
    trace = tmp_path / "trace"
    monkeypatch.setenv("TOKSHUF_TEST_PAUSE", "stage2.tmp")
    monkeypatch.setenv("TOKSHUF_TEST_TRACE", str(trace))
    node = cluster.add_worker()
    monkeypatch.delenv("TOKSHUF_TEST_PAUSE")
    monkeypatch.delenv("TOKSHUF_TEST_TRACE")
    build_losing_node(cluster, node, trace, "stage2.tmp", urls, store.url("caches/lost"), **opts)
    assert_same_files(want, without_input_names(store_files(store, "caches/lost")))
    assert store.pending_uploads() == []


def test_killed_driver_resumes_in_the_store(
    cluster: LocalCluster, store: S3, corpus: Tuple[List[Path], List[str]], tmp_path: Path
) -> None:
    """The driver is SIGKILLed once the first chunks are listed (and the manifest uploaded);
    the same build run again finishes the cache, byte-identical, without tokenizing again."""
    files, urls = corpus
    opts = dict(tokenizer=CL100K, seqlen=128, chunk_size=32, num_local_cells=4, format="json.gz")
    want = local_reference(files, tmp_path / "local", **opts)
    url, trace = store.url("caches/killed"), tmp_path / "trace"
    args = build_args(urls, url, local_cell_dir=str(tmp_path / "scratch"), **opts)
    env = dict(os.environ, TOKSHUF_TEST_PAUSE="stage2.listed", TOKSHUF_TEST_TRACE=str(trace))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args), cluster.address], env=env)
    try:
        wait_for(trace, "paused stage2.listed", lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads(store.get("caches/killed/tokshuf.json"))["status"] == "writing"
    assert store.get("caches/killed/manifest.jsonl").count(b"\n") > 0
    got = ray_build(urls, url, _ray.RayOptions(cpus_per_task=1, chunks_per_task=2), **opts)
    assert got["build"]["tasks"]["tokenize"] == 0  # stage 1 was done
    assert_same_files(want, without_input_names(store_files(store, "caches/killed")))
    assert store.pending_uploads() == []


def test_shuffle_only_into_a_store(
    cluster: LocalCluster, store: S3, corpus: Tuple[List[Path], List[str]], tmp_path: Path
) -> None:
    """A reshuffle has no stitched tails: the driver published a tails spill that was never
    made, so every shuffle-only Ray build into a store failed."""
    files, _ = corpus
    opts = dict(tokenizer=CL100K, seqlen=128, chunk_size=32)
    local_build(files, tmp_path / "source", **opts)
    shards = sorted((tmp_path / "source").glob("shard_*.tar"))
    again = dict(opts, shuffle_only=True, seed=5, num_local_cells=3)
    local_build(shards, tmp_path / "local", **again)
    options = _ray.RayOptions(cpus_per_task=1, task_bytes=1, chunks_per_task=2)
    ray_build(shards, store.url("caches/reshuffled"), options, **again)
    got = store_files(store, "caches/reshuffled")
    assert set(got) == {p.name for p in (tmp_path / "local").iterdir()}
    meta = json.loads(got.pop("tokshuf.json"))
    want = json.loads((tmp_path / "local" / "tokshuf.json").read_text())
    meta.pop("build"), want.pop("build")
    assert meta == want
    assert all(got[n] == (tmp_path / "local" / n).read_bytes() for n in got)
