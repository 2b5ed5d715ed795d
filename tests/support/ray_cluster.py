"""A real multi-node Ray cluster on this machine, every node on loopback.

`ray.cluster_utils.Cluster` starts a head and worker nodes as separate raylets (each with its
own object store and worker processes), which is as close to a cluster as one machine gets: a
task on a removed node really dies and is retried elsewhere. By default Ray picks the machine's
external interface for each node; tests must never bind or send there, so every node is told
127.0.0.1 and the environment says the same to anything Ray spawns, and the fixture fails
loudly if any node ends up elsewhere.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List

LOOPBACK = "127.0.0.1"

# Read by Ray when it is imported (ray_constants) and by every process it spawns, so set before
# the import below. The name says Windows/OSX, but it is the switch between "clusters" (the
# external address) and loopback everywhere.
ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
}
os.environ.update(ENV)

import pytest  # noqa: E402

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

# The holder actor below travels by value: worker processes cannot import the test support.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Small nodes: the machine running the tests has two cores shared with other work.
NODE_ARGS: Dict[str, Any] = {
    "num_cpus": 1,
    "node_ip_address": LOOPBACK,
    "include_dashboard": False,
    "object_store_memory": 80 * 1024 * 1024,
}


@dataclass
class LocalCluster:
    cluster: Cluster
    workers: List[Any]
    start_s: float

    @property
    def address(self) -> str:
        return self.cluster.address

    def alive_nodes(self) -> List[Dict[str, Any]]:
        return [n for n in ray.nodes() if n["Alive"]]

    def add_worker(self) -> Any:
        node = self.cluster.add_node(**NODE_ARGS)
        self.workers.append(node)
        check_loopback()
        return node

    def remove_worker(self, node: Any, timeout: float = 60.0) -> None:
        """Kill a worker node's processes (as a lost machine), then wait until the cluster
        has noticed."""
        self.cluster.remove_node(node, allow_graceful=False)
        self.workers.remove(node)
        deadline = time.monotonic() + timeout
        while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster still lists removed node {node.node_id} as alive")
            time.sleep(0.1)

    @contextmanager
    def only_on(self, node: Any) -> Iterator[Callable[[], None]]:
        """Tasks can start only on ``node`` while this holds: every CPU of every other node is
        taken by an idle actor pinned there. Yields a function that frees them (also done on
        exit). A test that needs a task on a given node gets it this way, whatever Ray's
        scheduler would otherwise prefer."""
        holders = [
            _Holder.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote()
            for n in self.alive_nodes()
            if n["NodeID"] != node.node_id
            for _ in range(int(n["Resources"].get("CPU", 0)))
        ]
        ray.get([h.ready.remote() for h in holders], timeout=120)

        def free() -> None:
            while holders:
                ray.kill(holders.pop())

        try:
            yield free
        finally:
            free()


@ray.remote(num_cpus=1)
class _Holder:
    """Holds one CPU of its node for as long as it lives."""

    def ready(self) -> bool:
        return True


def check_loopback() -> None:
    """Every node of the connected cluster is on 127.0.0.1, or the test stops here."""
    addresses = sorted({(n["NodeManagerAddress"], n.get("NodeManagerHostname", "")) for n in ray.nodes()})
    stray = [a for a, _ in addresses if a != LOOPBACK]
    if stray:
        raise RuntimeError(f"Ray nodes bound outside loopback: {addresses}; tests must stay on {LOOPBACK}")


@contextmanager
def local_cluster(workers: int = 2, cpus: int = 1) -> Iterator[LocalCluster]:
    """A head and `workers` worker nodes of `cpus` CPUs each, the driver connected; shut down after."""
    constants = ray._private.ray_constants
    if getattr(constants, "ENABLE_RAY_CLUSTER", False):
        raise RuntimeError(
            "ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set: nodes could pick the external address"
        )
    if ray.is_initialized():
        raise RuntimeError("a Ray driver is already connected in this process")
    t0 = time.monotonic()
    args = dict(NODE_ARGS, num_cpus=cpus)
    # A removed node is declared dead after about 2 s instead of Ray's default 15 or so.
    health = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
    cluster = Cluster(initialize_head=True, head_node_args=dict(args, _system_config=health))
    lc = LocalCluster(cluster, [], 0.0)
    try:
        for _ in range(workers):
            lc.workers.append(cluster.add_node(**args))
        ray.init(address=cluster.address, _node_ip_address=LOOPBACK, log_to_driver=False)
        cluster.wait_for_nodes()
        check_loopback()
        lc.start_s = time.monotonic() - t0
        yield lc
    finally:
        ray.shutdown()
        cluster.shutdown()
