"""``engine="ray"``: the build's steps run as Ray tasks (DESIGN §10, docs/distributed.md).

The driver plans, sends stage 1 over groups of input files and stage 2 over groups of chunks to
the cluster, and finalizes. Every step is pure and idempotent and publishes its output by a
rename on storage that every node sees (the output folder and its work folder), so a task lost
with its node, or retried after an error, rewrites the same bytes: the cache is the one a single
machine builds. What travels through Ray is small: file indices and chunk ranges out, summaries
and manifest lines back.

Ray is an optional dependency, imported only here and only when a build asks for this engine.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .exceptions import (
    ConfigError,
    InputError,
    OutputExistsError,
    TokenizerError,
    TokshufError,
)

INSTALL_HINT = 'engine="ray" needs Ray: pip install "tokshuf[ray]"'

# Stage-1 tasks take whole input files; files are grouped until a task holds this much input, so
# a task is worth its scheduling (tens of milliseconds) and its tokenizer load (0.1-0.2 s).
MIN_TASK_BYTES = 64 << 20
MAX_TASK_BYTES = 1 << 30
# Tasks per CPU slot the default sizes aim for: enough that a slow or lost node's share is
# picked up by the others, few enough that per-task costs stay small.
TASKS_PER_SLOT = 4
# Failures that are a property of the input or the options: the same task fails the same way
# on any node, so it is reported at once instead of being retried.
DETERMINISTIC = (InputError, ConfigError, TokenizerError, OutputExistsError)
# Attempts per task for other failures (a worker crash, an I/O error on shared storage), on top
# of Ray's own retries of tasks whose node died.
MAX_ATTEMPTS = 3
# Test hook, not a user feature: "STAGE:INDEX" makes the first attempt of that task raise.
FAULT_ENV = "TOKSHUF_TEST_RAY_FAULT"


def import_ray() -> Any:
    """The ``ray`` module, or a ConfigError saying what to install."""
    try:
        import ray
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray


@dataclass(frozen=True)
class RayOptions:
    """How the build uses the cluster. None of these change the cache's bytes."""

    address: str = "auto"
    # CPUs each task requests and runs threads on; default: the smallest node's CPUs, at most 8.
    cpus_per_task: Optional[int] = None
    # Input bytes per stage-1 task; default: about TASKS_PER_SLOT tasks per slot, clamped.
    task_bytes: Optional[int] = None
    # Chunks per stage-2 task; default: about TASKS_PER_SLOT tasks per slot.
    chunks_per_task: Optional[int] = None


@dataclass
class Session:
    """A connection to a cluster. ``owned``: this build called ``ray.init`` (and so disconnects
    after, which also stops a local cluster it started); a driver the caller connected is kept."""

    ray: Any
    owned: bool
    local: bool = False
    nodes: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def cpus(self) -> int:
        return int(sum(n["Resources"].get("CPU", 0) for n in self.nodes))

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()


def connect(address: Optional[str] = "auto") -> Session:
    """Join the running cluster (``auto``: RAY_ADDRESS or the one started on this machine, else
    a new local one), or the cluster at ``address``. A driver already connected is reused."""
    ray = import_ray()
    if ray.is_initialized():
        return Session(ray, owned=False, nodes=alive_nodes(ray))
    address = address or "auto"
    try:
        ray.init(address=address, log_to_driver=False)
    except ConnectionError as e:
        if address != "auto":
            raise ConfigError(f"cannot reach the Ray cluster at {address}: {e}") from None
        ray.init(log_to_driver=False)  # no cluster running: a local one, stopped after the build
        return Session(ray, owned=True, local=True, nodes=alive_nodes(ray))
    return Session(ray, owned=True, nodes=alive_nodes(ray))


def alive_nodes(ray: Any) -> List[Dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) > 0]


def group_files(sizes: Sequence[int], target_bytes: int) -> List[List[int]]:
    """Consecutive files grouped until a group holds ``target_bytes`` (a larger file is a group
    of its own). Pure: the same sizes give the same groups, so tasks get stable names."""
    groups: List[List[int]] = []
    current: List[int] = []
    held = 0
    for i, size in enumerate(sizes):
        current.append(i)
        held += size
        if held >= target_bytes:
            groups.append(current)
            current, held = [], 0
    if current:
        groups.append(current)
    return groups


def group_chunks(num_chunks: int, per_task: int) -> List[Tuple[int, int]]:
    """Chunk ranges ``[start, stop)`` of ``per_task`` chunks (the last may be shorter)."""
    per_task = max(1, per_task)
    return [(s, min(s + per_task, num_chunks)) for s in range(0, num_chunks, per_task)]


def default_cpus_per_task(nodes: Sequence[Dict[str, Any]]) -> int:
    smallest = min((int(n["Resources"].get("CPU", 1)) for n in nodes), default=1)
    return max(1, min(smallest, 8))


def default_task_bytes(total_bytes: int, slots: int) -> int:
    """About TASKS_PER_SLOT tasks per slot within [MIN, MAX]_TASK_BYTES, yet at least one task
    per slot where the files allow (a small build still uses every node)."""
    slots = max(1, slots)
    per = max(MIN_TASK_BYTES, min(MAX_TASK_BYTES, total_bytes // (slots * TASKS_PER_SLOT)))
    return max(1, min(per, -(-total_bytes // slots)))


def default_chunks_per_task(num_chunks: int, slots: int) -> int:
    return max(1, -(-num_chunks // max(1, slots * TASKS_PER_SLOT)))


def task_name(stage: str, index: int, count: int, what: str) -> str:
    """The name the Ray dashboard shows, e.g. ``tokshuf stage1 3/12 (files 40-59)``."""
    return f"tokshuf {stage} {index + 1}/{count} ({what})"


def span(items: Sequence[int], noun: str) -> str:
    if not items:
        return f"no {noun}"
    return f"{noun} {items[0]}" if len(items) == 1 else f"{noun} {items[0]}-{items[-1]}"


def _node_check(paths: List[str], version: str, args: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Runs on one node: which of ``paths`` it cannot see, its tokshuf version, and (``args``)
    the build's tokenizer loaded into this worker process for the tasks to come."""
    from . import __version__

    out: Dict[str, Any] = {
        "host": socket.gethostname(),
        "missing": [p for p in paths if not os.path.exists(p)],
        "version": __version__,
        "version_ok": __version__ == version,
    }
    if args is not None and out["version_ok"] and not out["missing"]:
        try:
            _steps(args)
        except TokshufError as e:
            out["error"] = e
    return out


def preflight_start(
    session: Session, paths: List[str], cpus: int, args: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """Send the pre-flight check to every node that can run a task (see ``preflight``); it runs
    while the driver loads the tokenizer and prepares the output folder."""
    ray = session.ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from . import __version__

    check = ray.remote(_node_check)
    refs = {
        n["NodeID"]: check.options(
            name=f"tokshuf preflight {n['NodeManagerAddress']}",
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False),
        ).remote(paths, __version__, args)
        for n in session.nodes
        if n["Resources"].get("CPU", 0) >= cpus
    }
    if not refs:
        raise ConfigError(f"no Ray node has {cpus} CPUs for one task; lower threads (CPUs per task)")
    return refs


def preflight_finish(session: Session, refs: Dict[str, Any]) -> None:
    from . import __version__

    problems = []
    for node_id, ref in refs.items():
        r = session.ray.get(ref)
        where = f"node {node_id[:8]} ({r['host']})"
        if r["missing"]:
            problems.append(
                f"{where} cannot see {', '.join(r['missing'])}: with engine='ray' the output folder, "
                "the work folder (local_cell_dir) and the inputs must be on storage every node sees"
            )
        if not r["version_ok"]:
            problems.append(f"{where} runs tokshuf {r['version']}, the driver {__version__}: install the same version")
        if isinstance(r.get("error"), TokshufError):
            raise r["error"]
    if problems:
        raise ConfigError("; ".join(problems))


def preflight(session: Session, paths: List[str], cpus: int, args: Optional[Dict[str, Any]] = None) -> None:
    """Before any work: every node sees ``paths`` (the output folder, an input; each task then
    checks the work folder), runs this tokshuf version, and can load the tokenizer. A node that
    cannot would fail every task sent to it, or worse, write to a folder no other node reads."""
    preflight_finish(session, preflight_start(session, paths, cpus, args))


def _existing(path: str) -> str:
    """``path``, or its nearest existing ancestor (the output folder may not exist yet)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def _check_work(steps: Any) -> None:
    if not os.path.isdir(steps.work):
        raise ConfigError(
            f"{socket.gethostname()} cannot see the work folder {steps.work}: with engine='ray' it must be "
            "on storage every node sees (local_cell_dir on a node's own disk cannot be used)"
        )


def _unwrap(ray: Any, err: BaseException) -> BaseException:
    """The exception a task raised, without Ray's wrapper (its traceback stays in the worker log)."""
    cause = getattr(err, "cause", None)
    if isinstance(err, ray.exceptions.RayTaskError) and isinstance(cause, BaseException):
        return cause
    return err


@dataclass
class Task:
    name: str
    fn: Callable[..., Any]
    args: Tuple[Any, ...]
    cpus: int


@dataclass
class StageResult:
    results: List[Any]
    retries: int
    seconds: float


def run_stage(
    session: Session,
    stage: str,
    tasks: List[Task],
    on_done: Callable[[int, Any], None],
) -> StageResult:
    """Run ``tasks`` on the cluster, results by task index; ``on_done`` is called on the driver
    as each finishes (progress, manifest lines). A failure that the input or options cause is
    raised at once with its own type; any other is retried up to MAX_ATTEMPTS times."""
    ray = session.ray
    t0 = time.monotonic()
    remote = {}

    def submit(i: int, attempt: int) -> Any:
        t = tasks[i]
        fn = remote.get(t.fn)
        if fn is None:
            fn = remote[t.fn] = ray.remote(t.fn)
        fault = os.environ.get(FAULT_ENV, "") if attempt == 0 else ""
        return fn.options(name=t.name, num_cpus=t.cpus, max_retries=3).remote(*t.args, _fault=fault == f"{stage}:{i}")

    pending = {submit(i, 0): (i, 0) for i in range(len(tasks))}
    results: List[Any] = [None] * len(tasks)
    retries = 0
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            ref = done[0]
            i, attempt = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except Exception as e:
                err = _unwrap(ray, e)
                if isinstance(err, DETERMINISTIC) or attempt + 1 >= MAX_ATTEMPTS:
                    if isinstance(err, TokshufError):
                        raise err from None
                    raise
                retries += 1
                pending[submit(i, attempt + 1)] = (i, attempt + 1)
                continue
            on_done(i, results[i])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return StageResult(results, retries, time.monotonic() - t0)


def build_record(session: Session, cpus_per_task: int, stages: Dict[str, StageResult], t0: float) -> Dict[str, Any]:
    """What ``build`` in tokshuf.json says about a Ray run (it varies by run, DESIGN §2)."""
    return {
        "engine": "ray",
        "ray_version": session.ray.__version__,
        "nodes": len(session.nodes),
        "cpus": session.cpus,
        "cpus_per_task": cpus_per_task,
        "tasks": {name: len(s.results) for name, s in stages.items()},
        "retries": sum(s.retries for s in stages.values()),
        "host": socket.gethostname(),
        "durations": {f"{name}_s": s.seconds for name, s in stages.items()},
        "total_s": time.monotonic() - t0,
    }


# --- the build ---------------------------------------------------------------------------------

# Steps objects of this worker process, by recipe: loading the tokenizer once per process, not
# once per task (Ray reuses worker processes).
_STEPS: Dict[str, Any] = {}


def _steps(args: Dict[str, Any]) -> Any:
    from . import _core

    tok = str(args.get("tokenizer", ""))
    stamp = (os.stat(tok).st_size, os.stat(tok).st_mtime_ns) if os.path.isfile(tok) else None
    key = json.dumps([args, stamp], sort_keys=True, default=str)  # a tokenizer file replaced: reload
    steps = _STEPS.get(key)
    if steps is None:
        if len(_STEPS) >= 4:
            _STEPS.clear()
        steps = _STEPS[key] = _core.BuildSteps(**args)
    return steps


def _task_threads() -> int:
    ray = import_ray()
    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


def _stage1_task(args: Dict[str, Any], files: List[int], _fault: bool = False) -> List[Dict[str, int]]:
    """Tokenize ``files`` into their spills; returns a few figures per file (the summaries
    themselves stay on storage for the driver's chunk plan)."""
    if _fault:
        raise OSError(f"injected fault in stage 1, files {files} ({FAULT_ENV})")
    steps = _steps(args)
    _check_work(steps)
    out = []
    for f, text in zip(files, steps.stage1(files, _task_threads())):
        s = json.loads(text)
        out.append({"file": f, "num_tokens": s["num_tokens"], "text_bytes": s["text_bytes"]})
    return out


def _stage2_task(args: Dict[str, Any], first: int, last: int, _fault: bool = False) -> List[str]:
    """Write chunks ``first..last``; returns their manifest lines (JSON)."""
    if _fault:
        raise OSError(f"injected fault in stage 2, chunks {first}-{last - 1} ({FAULT_ENV})")
    steps = _steps(args)
    _check_work(steps)
    return list(steps.stage2(first, last, _task_threads()))


def build(args: Dict[str, Any], options: RayOptions, progress: bool) -> Dict[str, Any]:
    """Build (or resume, or confirm) the cache described by ``args`` (the arguments of
    ``_core.BuildSteps``) on the cluster. Returns tokshuf.json."""
    from . import _core

    t0 = time.monotonic()
    session = connect(options.address)
    try:
        connect_s = time.monotonic() - t0
        cpus = options.cpus_per_task or default_cpus_per_task(session.nodes)
        inputs = [os.fspath(p) for p in args["inputs"]]
        checks = preflight_start(session, [_existing(os.fspath(args["output"])), *inputs[:1]], cpus, args)
        steps = _core.BuildSteps(**args)
        record: Dict[str, Any] = {"engine": "ray", "nodes": len(session.nodes), "cpus": session.cpus}
        done_meta = steps.begin(json.dumps(record))
        if done_meta is not None:
            return json.loads(done_meta)
        try:
            t = time.monotonic()
            preflight_finish(session, checks)
            preflight_s = time.monotonic() - t
            bar = _core.Progress(progress)
            try:
                return _run(session, steps, args, options, cpus, bar, t0, connect_s, preflight_s)
            finally:
                bar.end()  # an error's message then starts on a line of its own
        except BaseException:
            steps.release()
            raise
    finally:
        session.close()


def _run(
    session: Session,
    steps: Any,
    args: Dict[str, Any],
    options: RayOptions,
    cpus: int,
    bar: Any,
    t0: float,
    connect_s: float,
    preflight_s: float,
) -> Dict[str, Any]:
    slots = max(1, session.cpus // cpus)
    stages: Dict[str, StageResult] = {}

    # Stage 1: groups of files not done by a killed run.
    sizes = steps.input_sizes()
    done = set(steps.files_done())
    todo = [f for f in range(len(sizes)) if f not in done]
    target = options.task_bytes or default_task_bytes(sum(sizes[f] for f in todo), slots)
    groups = [[todo[i] for i in g] for g in group_files([sizes[f] for f in todo], target)]
    tasks = [
        Task(task_name("stage1", i, len(groups), span(g, "files")), _stage1_task, (args, g), cpus)
        for i, g in enumerate(groups)
    ]
    bar.stage("tokenize", len(sizes), "files")
    bar.advance(len(done))

    def on_stage1(i: int, result: List[Dict[str, int]]) -> None:
        bar.advance(len(result), sum(sizes[r["file"]] for r in result), sum(r["num_tokens"] for r in result))

    stages["tokenize"] = run_stage(session, "stage1", tasks, on_stage1)
    bar.end()

    # The chunk plan, on the driver.
    t = time.monotonic()
    num_chunks = steps.plan_chunks(min(cpus, os.cpu_count() or 1), json.dumps(_partial(session, cpus, stages, t0)))
    plan_s = time.monotonic() - t

    # Stage 2: ranges of chunks a killed run did not list.
    listed = steps.listed
    per = options.chunks_per_task or default_chunks_per_task(num_chunks - listed, slots)
    ranges = [(listed + a, listed + b) for a, b in group_chunks(num_chunks - listed, per)]
    tasks = [
        Task(task_name("stage2", i, len(ranges), span([a, b - 1], "chunks")), _stage2_task, (args, a, b), cpus)
        for i, (a, b) in enumerate(ranges)
    ]
    bar.stage("write", num_chunks, "chunks")
    bar.advance(listed)

    def on_stage2(i: int, lines: List[str]) -> None:
        steps.add_lines(ranges[i][0], lines)
        parsed = [json.loads(line) for line in lines]
        bar.advance(len(lines), sum(p["bytes"] for p in parsed), sum(p["num_tokens"] for p in parsed))

    stages["write"] = run_stage(session, "stage2", tasks, on_stage2)
    bar.end()

    record = build_record(session, cpus, stages, t0)
    record["durations"] = {
        "connect_s": connect_s,
        "preflight_s": preflight_s,
        "tokenize_s": stages["tokenize"].seconds,
        "plan_s": plan_s,
        "write_s": stages["write"].seconds,
    }
    record["threads"] = session.cpus
    record["total_s"] = time.monotonic() - t0
    return json.loads(steps.finish(json.dumps(record)))


def _partial(session: Session, cpus: int, stages: Dict[str, StageResult], t0: float) -> Dict[str, Any]:
    return build_record(session, cpus, stages, t0)
