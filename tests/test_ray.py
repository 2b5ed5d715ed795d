"""engine="ray" on a real local cluster: a head and two worker nodes of 1 CPU each, on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
import tokshuf
from support.ray_builds import (
    CL100K,
    DRIVER,
    NEOX,
    SAMPLE,
    assert_same_cache,
    assert_same_tree,
    build_args,
    build_losing_node,
    local_build,
    ray_build,
    sample_parts,
    wait_for,
)
from support.ray_cluster import ENV, LOOPBACK, LocalCluster, local_cluster
from tokshuf import _ray
from tokshuf.exceptions import ClusterError, ConfigError, InputError

ray = pytest.importorskip("ray")
# Task functions defined here travel by value: worker processes cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
# Starting and stopping Ray's node processes occasionally leaves an object of Ray's to the
# garbage collector (seen once in about ten runs, at cluster start, as an unraisable-exception
# warning); with filterwarnings=error that would fail a test over Ray's housekeeping.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with local_cluster(workers=2) as c:
        yield c


def _where(i: int, _fault: bool = False) -> str:

    time.sleep(0.3)  # long enough that one node cannot take every task
    return ray.get_runtime_context().get_node_id()


def _flaky(i: int, _fault: bool = False) -> int:
    if _fault:
        raise OSError(f"injected failure in task {i}")
    return i * i


def _crash(i: int, _fault: bool = False) -> int:
    if i == 1:
        os._exit(1)  # the worker dies, as when the kernel kills it for memory
    return i


def _bad_input(i: int, _fault: bool = False) -> int:
    if i == 2:
        raise InputError(f"in{i}.jsonl:7: invalid JSON")
    return i


# A driver of its own (the test process's driver is connected without the variable): the
# workers' answers show what reached them.
ENV_PROBE = """
import os, sys
from tokshuf import _ray
def probe(i, _fault=False):
    return os.environ.get("TOKSHUF_REMOTE_RETRIES")
session = _ray.connect(sys.argv[1])
try:
    tasks = [_ray.Task(f"env {i}", probe, (i,), 1) for i in range(3)]
    print(sorted(set(_ray.run_stage(session, "env", tasks, lambda i, r: None).results)))
finally:
    session.close()
"""


@pytest.mark.slow
def test_remote_settings_of_the_driver_reach_every_worker(cluster: LocalCluster) -> None:
    assert "TOKSHUF_REMOTE_RETRIES" not in os.environ
    env = dict(os.environ, TOKSHUF_REMOTE_RETRIES="3")
    out = subprocess.run(
        [sys.executable, "-c", ENV_PROBE, cluster.address], env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "['3']"


@pytest.mark.slow
def test_cluster_is_multi_node_on_loopback(cluster: LocalCluster, record_property) -> None:
    record_property("cluster_start_s", round(cluster.start_s, 2))
    nodes = cluster.alive_nodes()
    assert len(nodes) == 3
    assert {n["NodeManagerAddress"] for n in nodes} == {LOOPBACK}
    assert all(n["Resources"]["CPU"] == 1 for n in nodes)
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == ENV["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    session = _ray.connect("auto")  # the driver already connected: reused, not owned
    assert not session.owned and len(session.nodes) == 3 and session.cpus == 3
    assert not _ray.connect(cluster.address).owned  # the same cluster, named
    # Another cluster named: it was ignored, and the build ran on this one.
    with pytest.raises(ConfigError, match="already connected to the Ray cluster at"):
        _ray.connect("10.255.255.1:6379")
    tasks = [_ray.Task(_ray.task_name("probe", i, 6, f"task {i}"), _where, (i,), 1) for i in range(6)]
    done = []
    out = _ray.run_stage(session, "probe", tasks, lambda i, r: done.append(i))
    assert sorted(done) == list(range(6))
    assert len(set(out.results)) >= 2, "tasks ran on one node only"


@pytest.mark.slow
def test_failed_task_is_retried(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_ray.FAULT_ENV, "flaky:1")
    session = _ray.connect("auto")
    tasks = [_ray.Task(f"flaky {i}", _flaky, (i,), 1) for i in range(3)]
    out = _ray.run_stage(session, "flaky", tasks, lambda i, r: None)
    assert out.results == [0, 1, 4]
    assert out.retries == 1


@pytest.mark.slow
def test_a_worker_that_keeps_dying_is_a_cluster_error(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # It was Ray's WorkerCrashedError, and the command line printed its traceback.
    monkeypatch.setattr(_ray, "MAX_ATTEMPTS", 1)  # Ray's own retries still run
    session = _ray.connect("auto")
    tasks = [_ray.Task(f"crash {i}", _crash, (i,), 1) for i in range(3)]
    with pytest.raises(
        ClusterError,
        match=r"^crash 1: the cluster failed it on every attempt \(WorkerCrashedError: .*run the same build again",
    ):
        _ray.run_stage(session, "crash", tasks, lambda i, r: None)


@pytest.mark.slow
def test_input_error_is_raised_with_its_type_not_retried(cluster: LocalCluster) -> None:
    session = _ray.connect("auto")
    tasks = [_ray.Task(f"bad {i}", _bad_input, (i,), 1) for i in range(4)]
    with pytest.raises(InputError, match=r"^in2\.jsonl:7: invalid JSON$"):
        _ray.run_stage(session, "bad", tasks, lambda i, r: None)


def _probe(work: str, paths: List[str], urls: List[str], _fault: bool = False) -> bool:
    _ray._CHECKED.clear()  # a fresh build for this worker process
    _ray._check_node(work, paths, urls)
    return True


@pytest.mark.slow
def test_a_node_that_cannot_see_or_reach_a_path_stops_the_build(cluster: LocalCluster, tmp_path: Path) -> None:
    """A task checks its node before its first work (the work folder, an input, the output):
    a node that fails is named in a ConfigError that stops the stage at once."""
    session = _ray.connect("auto")
    ok = [_ray.Task(f"ok {i}", _probe, (str(tmp_path), [str(tmp_path)], []), 1) for i in range(3)]
    assert _ray.run_stage(session, "probe", ok, lambda i, r: None).results == [True] * 3
    missing = tmp_path / "not-shared"
    bad = [_ray.Task(f"bad {i}", _probe, (str(tmp_path), [str(missing)], []), 1) for i in range(3)]
    with pytest.raises(ConfigError, match=r"^node [0-9a-f]{8} \(.*\) cannot see .*not-shared.*storage every node sees"):
        _ray.run_stage(session, "probe", bad, lambda i, r: None)
    # A store this node has no configuration for (no Azure account here): never contacted.
    url = "az://container/cache/tokshuf.json"
    unreachable = [_ray.Task("store", _probe, (str(tmp_path), [], [url]), 1)]
    with pytest.raises(ConfigError, match=r"cannot reach az://container/cache/tokshuf.json .*credentials and endpoint"):
        _ray.run_stage(session, "probe", unreachable, lambda i, r: None)
    with pytest.raises(ConfigError, match="no Ray node has 2 CPUs"):
        _ray.build({"inputs": [], "output": str(tmp_path / "x")}, _ray.RayOptions(cpus_per_task=2), progress=False)


def test_group_files_fills_groups_in_order() -> None:
    assert _ray.group_files([], 10) == []
    assert _ray.group_files([3, 3, 3, 3, 3], 6) == [[0, 1], [2, 3], [4]]
    assert _ray.group_files([50, 1, 1, 20, 1], 10) == [[0], [1, 2, 3], [4]]
    groups = _ray.group_files([7] * 100, 64)
    assert [i for g in groups for i in g] == list(range(100))


def test_group_chunks_covers_every_chunk_once() -> None:
    assert _ray.group_chunks(0, 4) == []
    assert _ray.group_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert _ray.group_chunks(3, 0) == [(0, 1), (1, 2), (2, 3)]


def test_default_sizes() -> None:
    assert _ray.default_task_bytes(10, 4) == 3  # small builds: one task per slot
    assert _ray.default_task_bytes(1 << 30, 4) == _ray.MIN_TASK_BYTES
    assert _ray.default_task_bytes(10 << 40, 2048) == _ray.MAX_TASK_BYTES
    assert _ray.default_chunks_per_task(1000, 10) == 25
    assert _ray.default_cpus_per_task([{"Resources": {"CPU": 32.0}}, {"Resources": {"CPU": 4.0}}]) == 4


def test_missing_ray_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r'pip install "tokshuf\[ray\]"'):
        _ray.import_ray()
    assert issubclass(ConfigError, tokshuf.TokshufError)


def test_engine_ray_without_ray_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r'pip install "tokshuf\[ray\]"'):
        tokshuf.build_cache(SAMPLE, tmp_path / "c", engine="ray", progress=False)
    with pytest.raises(ConfigError, match="engine must be"):
        tokshuf.build_cache(SAMPLE, tmp_path / "c", engine="spark", progress=False)
    with pytest.raises(ConfigError, match="ray_address"):
        tokshuf.build_cache(SAMPLE, tmp_path / "c", ray_address="auto", progress=False)
    assert not (tmp_path / "c").exists()


def test_core_package_never_imports_ray(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "sample" / "kjv.jsonl"
    code = (
        "import sys, tokshuf\n"
        f"tokshuf.build_cache({str(data)!r}, {str(tmp_path / 'c')!r}, progress=False, seqlen=64, chunk_size=64)\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- builds on the cluster: the same bytes as one machine --------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> List[Path]:
    return sample_parts(tmp_path_factory.mktemp("corpus"))


RECIPES = [
    pytest.param(
        dict(tokenizer=NEOX, format="npy", tail="stitch", shuffle=True), (1, 3), id="neox-npy-stitch-shuffled"
    ),
    pytest.param(dict(tokenizer=NEOX, format="json.gz", tail="pad", shuffle=False), (2, 1), id="neox-json-pad-ordered"),
    pytest.param(dict(tokenizer=CL100K, format="npy", tail="pad", shuffle=True), (1, 1), id="cl100k-npy-pad-shuffled"),
    pytest.param(
        dict(tokenizer=CL100K, format="json.gz", tail="stitch", shuffle=False), (3, 4), id="cl100k-json-stitch-ordered"
    ),
    pytest.param(
        dict(tokenizer=NEOX, format="blocks", block_size=5, tail="stitch", shuffle=True),
        (1, 2),
        id="neox-blocks-shuffled",
    ),
    pytest.param(
        dict(tokenizer=CL100K, format="blocks.zst", block_size=6, tail="pad", shuffle=False),
        (2, 3),
        id="cl100k-blockszst-ordered",
    ),
    # tokshuf.json's padding_fraction goes through the chunk plan's JSON on this engine.
    pytest.param(dict(tokenizer=CL100K, format="npy", packing="bestfit", shuffle=True), (1, 2), id="cl100k-bestfit"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "sizes"), RECIPES)
def test_ray_build_is_byte_identical_to_local(
    cluster: LocalCluster, corpus: List[Path], tmp_path: Path, recipe: Dict[str, Any], sizes: Tuple[int, int]
) -> None:
    opts = dict(recipe, seqlen=128, chunk_size=32, num_local_cells=5, seed=7)
    want = local_build(corpus, tmp_path / "local", **opts)
    files_per_task, chunks_per_task = sizes
    # task_bytes of 1 puts each file in its own task; larger groups take several.
    task_bytes = 1 if files_per_task == 1 else sum(p.stat().st_size for p in corpus[:files_per_task])
    options = _ray.RayOptions(cpus_per_task=1, task_bytes=task_bytes, chunks_per_task=chunks_per_task)
    got = ray_build(corpus, tmp_path / "ray", options, **opts)
    assert_same_cache(tmp_path / "local", tmp_path / "ray")
    assert want["num_chunks"] > 4 and want["build"]["engine"] == "local"
    b = got["build"]
    assert (b["engine"], b["nodes"], b["cpus"], b["retries"]) == ("ray", 3, 3, 0)
    assert b["tasks"]["tokenize"] >= len(corpus) // files_per_task
    assert b["tasks"]["write"] == -(-want["num_chunks"] // chunks_per_task)
    assert set(b["durations"]) == {"connect_s", "tokenize_s", "plan_s", "regroup_s", "write_s"}
    # Run again: the complete cache is confirmed, not rebuilt.
    assert ray_build(corpus, tmp_path / "ray", options, **opts)["build"] == b


@pytest.mark.slow
def test_public_api_and_cli_run_on_the_cluster(cluster: LocalCluster, corpus: List[Path], tmp_path: Path) -> None:
    opts = dict(tokenizer=CL100K, seqlen=256, chunk_size=16)
    local_build(corpus, tmp_path / "local", **opts)
    stats = tokshuf.build_cache(
        corpus, tmp_path / "api", progress=False, engine="ray", ray_address=cluster.address, **opts
    )
    assert stats.metadata["build"]["engine"] == "ray"
    assert_same_cache(tmp_path / "local", tmp_path / "api")
    cmd = [sys.executable, "-m", "tokshuf", "build", "--engine", "ray", "--ray-address", cluster.address]
    cmd += ["--output", str(tmp_path / "cli"), "--tokenizer", CL100K, "--seqlen", "256", "--chunk-size", "16"]
    cmd += [a for p in corpus for a in ("--input", str(p))]
    subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    assert_same_cache(tmp_path / "local", tmp_path / "cli")


@pytest.mark.slow
def test_bad_line_same_error_and_same_skips(cluster: LocalCluster, corpus: List[Path], tmp_path: Path) -> None:
    bad = tmp_path / "in" / "bad.jsonl"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"text": "fine"}) + "\n" + '{"text": "cut\n' + json.dumps({"text": "after"}) + "\n")
    inputs = [*corpus, bad]
    opts = dict(seqlen=128, chunk_size=32)
    with pytest.raises(InputError) as local_err:
        local_build(inputs, tmp_path / "local", **opts)
    with pytest.raises(InputError) as ray_err:
        ray_build(inputs, tmp_path / "ray", _ray.RayOptions(cpus_per_task=1, task_bytes=1), **opts)
    assert str(ray_err.value) == str(local_err.value)
    assert f"{bad}:2" in str(ray_err.value)
    want = local_build(inputs, tmp_path / "local-skip", errors="skip", **opts)
    got = ray_build(
        inputs, tmp_path / "ray-skip", _ray.RayOptions(cpus_per_task=1, task_bytes=1), errors="skip", **opts
    )
    assert got["skipped"] == want["skipped"] and sum(want["skipped"].values()) == 1
    assert_same_cache(tmp_path / "local-skip", tmp_path / "ray-skip")


@pytest.mark.slow
def test_failed_tasks_are_retried_to_the_same_bytes(
    cluster: LocalCluster, corpus: List[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opts = dict(tokenizer=NEOX, seqlen=128, chunk_size=32, num_local_cells=3)
    local_build(corpus, tmp_path / "local", **opts)
    options = _ray.RayOptions(cpus_per_task=1, task_bytes=1, chunks_per_task=2)
    for fault in ("stage1:3", "stage2:1"):
        monkeypatch.setenv(_ray.FAULT_ENV, fault)
        got = ray_build(corpus, tmp_path / fault.replace(":", "-"), options, **opts)
        assert got["build"]["retries"] == 1
        assert_same_cache(tmp_path / "local", tmp_path / fault.replace(":", "-"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "unpacked"),
    [("stage1.spill", False), ("stage2.tmp", False), ("stage2.tmp", True)],
    ids=["stage1.spill", "stage2.tmp", "stage2.tmp-unpacked"],
)
def test_worker_node_lost_mid_stage(
    cluster: LocalCluster,
    corpus: List[Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    point: str,
    unpacked: bool,
) -> None:
    """A fourth node whose tasks stop for good at `point` (a spill renamed but its summary not
    yet written; a shard written under its temporary name) is removed while they hang: its
    task is retried on the other nodes and the cache is the one machine's. Until the task has
    paused, the other nodes' CPUs are held, so the doomed node runs the first task of the
    stage whatever the scheduler prefers (all of stage 1 too, for a pause in stage 2). Unpacked:
    the lost task's temporary file is in a bin's folder, which other tasks write meanwhile."""
    opts = dict(tokenizer=NEOX, seqlen=128, chunk_size=32, num_local_cells=4, tail="pad")
    if unpacked:
        opts.update(packing="none", bins=[32, 128], chunk_size=8)
    local_build(corpus, tmp_path / "local", **opts)
    trace = tmp_path / "trace"
    # The node's raylet, and so its workers, inherit the hooks; this driver does not.
    monkeypatch.setenv("TOKSHUF_TEST_PAUSE", point)
    monkeypatch.setenv("TOKSHUF_TEST_TRACE", str(trace))
    node = cluster.add_worker()
    monkeypatch.delenv("TOKSHUF_TEST_PAUSE")
    monkeypatch.delenv("TOKSHUF_TEST_TRACE")
    assert len(cluster.alive_nodes()) == 4
    meta = build_losing_node(cluster, node, trace, point, corpus, tmp_path / "ray", **opts)
    (assert_same_tree if unpacked else assert_same_cache)(tmp_path / "local", tmp_path / "ray")
    assert meta["build"]["nodes"] == 4
    assert len(cluster.alive_nodes()) == 3
    assert trace.read_text().count(f"paused {point}") == 1


@pytest.mark.slow
@pytest.mark.parametrize("point", ["plan", "stage2.listed"])
def test_killed_driver_resumes_to_the_same_bytes(
    cluster: LocalCluster, corpus: List[Path], tmp_path: Path, point: str
) -> None:
    """The driver is SIGKILLed after stage 1 (the chunk plan published), or once the first
    chunks are listed; the same build run again finishes the cache, byte-identical."""
    opts = dict(tokenizer=CL100K, seqlen=128, chunk_size=32, num_local_cells=4, format="json.gz")
    local_build(corpus, tmp_path / "local", **opts)
    out, trace = tmp_path / "ray", tmp_path / "trace"
    args = build_args(corpus, out, **opts)
    env = dict(os.environ, TOKSHUF_TEST_PAUSE=point, TOKSHUF_TEST_TRACE=str(trace))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args), cluster.address], env=env)
    try:
        wait_for(trace, f"paused {point}", lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    status = json.loads((out / "tokshuf.json").read_text())["status"]
    assert status == "writing"
    listed = (out / "manifest.jsonl").read_text().count("\n")
    assert (listed > 0) == (point == "stage2.listed")
    got = ray_build(corpus, out, _ray.RayOptions(cpus_per_task=1, chunks_per_task=2), **opts)
    assert_same_cache(tmp_path / "local", out)
    assert got["build"]["tasks"]["tokenize"] == 0  # stage 1 was done


# --- unpacked caches (packing="none"): each length bin's chunks written by tasks ---------------

UNPACKED = [
    pytest.param(dict(tokenizer=NEOX, bins=[16, 48, 128]), 2, id="neox-bins"),
    pytest.param(dict(tokenizer=CL100K), 3, id="cl100k-default-bins"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("recipe", "chunks_per_task"), UNPACKED)
def test_unpacked_ray_build_is_byte_identical_to_local(
    cluster: LocalCluster, corpus: List[Path], tmp_path: Path, recipe: Dict[str, Any], chunks_per_task: int
) -> None:
    """Every bin's shards, sidecars and manifest, and tokshuf.json, are the local engine's, with
    several stage-2 tasks per bin."""
    opts = dict(recipe, packing="none", seqlen=128, chunk_size=8, seed=3)
    want = local_build(corpus, tmp_path / "local", **opts)
    options = _ray.RayOptions(cpus_per_task=1, task_bytes=1, chunks_per_task=chunks_per_task)
    got = ray_build(corpus, tmp_path / "ray", options, **opts)
    assert_same_tree(tmp_path / "local", tmp_path / "ray")
    chunks = [b["num_chunks"] for b in want["bins"]]
    assert len(chunks) >= 3 and max(chunks) > 2 * chunks_per_task
    b = got["build"]
    assert (b["engine"], b["nodes"], b["retries"]) == ("ray", 3, 0)
    assert b["tasks"]["write"] == sum(-(-n // chunks_per_task) for n in chunks)
    assert "regroup" not in b["tasks"]
    # Run again: the complete cache is confirmed, not rebuilt.
    assert ray_build(corpus, tmp_path / "ray", options, **opts)["build"] == b


@pytest.mark.slow
def test_killed_unpacked_driver_resumes_to_the_same_bytes(
    cluster: LocalCluster, corpus: List[Path], tmp_path: Path
) -> None:
    """The driver is SIGKILLed once the lines of a first stage-2 task are back (shards in the
    bins, no bin manifest yet); the same build run again writes those shards again (a shard no
    manifest lists is not trusted) and finishes the cache, byte-identical (temporary files of
    tasks killed with it removed)."""
    opts = dict(tokenizer=CL100K, packing="none", bins=[32, 128], seqlen=128, chunk_size=8)
    local_build(corpus, tmp_path / "local", **opts)
    out, trace = tmp_path / "ray", tmp_path / "trace"
    env = dict(os.environ, TOKSHUF_TEST_PAUSE="stage2.listed", TOKSHUF_TEST_TRACE=str(trace))
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(build_args(corpus, out, **opts)), cluster.address], env=env
    )
    try:
        wait_for(trace, "paused stage2.listed", lambda: proc.poll() is None)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads((out / "tokshuf.json").read_text())["status"] == "writing"
    written = {p: p.stat().st_mtime_ns for p in out.glob("bin_*/*.tar")}
    assert written and not list(out.glob("bin_*/manifest.jsonl"))
    got = ray_build(corpus, out, _ray.RayOptions(cpus_per_task=1, chunks_per_task=2), **opts)
    assert_same_tree(tmp_path / "local", out)
    assert all(p.stat().st_mtime_ns != t for p, t in written.items())  # written again, not trusted
    assert got["build"]["tasks"]["tokenize"] == 0  # stage 1 was done
