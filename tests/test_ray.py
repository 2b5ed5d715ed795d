"""engine="ray" on a real local cluster: a head and two worker nodes of 1 CPU each, on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import tokshuf
from ray_cluster import ENV, LOOPBACK, LocalCluster, local_cluster
from tokshuf import _ray
from tokshuf.exceptions import ConfigError, InputError

ray = pytest.importorskip("ray")
# Task functions defined here travel by value: worker processes cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with local_cluster(workers=2) as c:
        yield c


def _where(i: int, _fault: bool = False) -> str:
    import time

    time.sleep(0.3)  # long enough that one node cannot take every task
    return ray.get_runtime_context().get_node_id()


def _flaky(i: int, _fault: bool = False) -> int:
    if _fault:
        raise OSError(f"injected failure in task {i}")
    return i * i


def _bad_input(i: int, _fault: bool = False) -> int:
    if i == 2:
        raise InputError(f"in{i}.jsonl:7: invalid JSON")
    return i


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
    tasks = [_ray.Task(_ray.task_name("probe", i, 6, f"task {i}"), _where, (i,), 1) for i in range(6)]
    done = []
    out = _ray.run_stage(session, "probe", tasks, _ray.Progress(False), lambda i, r: done.append(i))
    assert sorted(done) == list(range(6))
    assert len(set(out.results)) >= 2, "tasks ran on one node only"


@pytest.mark.slow
def test_failed_task_is_retried(cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_ray.FAULT_ENV, "flaky:1")
    session = _ray.connect("auto")
    tasks = [_ray.Task(f"flaky {i}", _flaky, (i,), 1) for i in range(3)]
    out = _ray.run_stage(session, "flaky", tasks, _ray.Progress(False), lambda i, r: None)
    assert out.results == [0, 1, 4]
    assert out.retries == 1


@pytest.mark.slow
def test_input_error_is_raised_with_its_type_not_retried(cluster: LocalCluster) -> None:
    session = _ray.connect("auto")
    tasks = [_ray.Task(f"bad {i}", _bad_input, (i,), 1) for i in range(4)]
    with pytest.raises(InputError, match=r"^in2\.jsonl:7: invalid JSON$"):
        _ray.run_stage(session, "bad", tasks, _ray.Progress(False), lambda i, r: None)


@pytest.mark.slow
def test_preflight_names_the_path_a_node_cannot_see(cluster: LocalCluster, tmp_path: Path) -> None:
    session = _ray.connect("auto")
    _ray.preflight(session, [str(tmp_path)], cpus=1)
    missing = tmp_path / "not-shared"
    with pytest.raises(ConfigError, match=r"not-shared.*storage every node sees"):
        _ray.preflight(session, [str(tmp_path), str(missing)], cpus=1)
    with pytest.raises(ConfigError, match="no Ray node has 2 CPUs"):
        _ray.preflight(session, [str(tmp_path)], cpus=2)


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
    assert _ray.default_task_bytes(10, 4) == _ray.MIN_TASK_BYTES
    assert _ray.default_task_bytes(10 << 40, 2048) == _ray.MAX_TASK_BYTES
    assert _ray.default_chunks_per_task(1000, 10) == 25
    assert _ray.default_cpus_per_task([{"Resources": {"CPU": 32.0}}, {"Resources": {"CPU": 4.0}}]) == 4


def test_missing_ray_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r'pip install "tokshuf\[ray\]"'):
        _ray.import_ray()
    assert issubclass(ConfigError, tokshuf.TokshufError)


def test_core_package_never_imports_ray(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "sample" / "kjv.jsonl"
    code = (
        "import sys, tokshuf\n"
        f"tokshuf.build_cache({str(data)!r}, {str(tmp_path / 'c')!r}, progress=False, seqlen=64, chunk_size=64)\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
