"""``engine="ray"``: the build's steps run as Ray tasks (DESIGN §10, docs/distributed.md).

The driver plans, sends stage 1 over groups of input files, then (shuffled builds) the regroup
of their spills in cell order and stage 2 over groups of chunks (unpacked builds: over ranges of
each length bin's chunks) to the cluster, and finalizes.
Every step is pure and idempotent and publishes its output whole, by a rename on storage every
node sees or as one object in a store (the output and its work folder), so a task lost with its
node, or retried after an error, rewrites the same bytes: the cache is the one a single machine
builds. What travels through Ray is small: the recipe once, file indices and chunk ranges out,
summaries and manifest lines back.

Ray is an optional dependency, imported only here and only when a build asks for this engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ._remote import is_url
from .exceptions import (
    ClusterError,
    ConfigError,
    InputError,
    InputNotFoundError,
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
    a new local one), or the cluster at ``address``. A driver already connected is reused; an
    ``address`` naming another cluster is then refused, not silently replaced by that one."""
    ray = import_ray()
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address not in (None, "auto") and address != current:
            raise ConfigError(
                f"ray_address {address!r}: this process is already connected to the Ray cluster at {current}; "
                "leave ray_address out to build on that one, or call ray.shutdown() first"
            )
        return Session(ray, owned=False, nodes=alive_nodes(ray))
    address = address or "auto"
    try:
        ray.init(address=address, log_to_driver=False, **_job_env())
    except ConnectionError as e:
        if address != "auto":
            raise ConfigError(f"cannot reach the Ray cluster at {address}: {e}") from None
        ray.init(log_to_driver=False, **_job_env())  # no cluster running: a local one, stopped after the build
        return Session(ray, owned=True, local=True, nodes=alive_nodes(ray))
    return Session(ray, owned=True, nodes=alive_nodes(ray))


def _job_env() -> Dict[str, Any]:
    """The driver's object-store settings (``TOKSHUF_REMOTE_*``, e.g. from ``--s3-retries``)
    for every worker of this job: workers that ``ray start`` began on other machines do not
    inherit the driver's environment."""
    env = {k: v for k, v in os.environ.items() if k.startswith("TOKSHUF_REMOTE_")}
    return {"runtime_env": {"env_vars": env}} if env else {}


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


def _node_problems(paths: Sequence[str], urls: Sequence[str]) -> List[str]:
    """What keeps this node from taking part: ``paths`` it cannot see, ``urls`` it cannot reach."""
    from . import _core

    problems = []
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        problems.append(
            f"cannot see {', '.join(missing)}: with engine='ray' the output folder, the work folder "
            "(local_cell_dir) and the inputs must be on storage every node sees"
        )
    for url in urls:
        try:
            _core._storage_head(url)
        except InputNotFoundError:
            pass  # reachable, and nothing there yet
        except TokshufError as e:
            problems.append(
                f"cannot reach {url} ({e}): every node needs the store's credentials and endpoint "
                "(AWS_*, GOOGLE_*, AZURE_* in its environment when `ray start` runs, or an instance role)"
            )
    return problems


# Builds whose node check this worker process has passed (by work folder).
_CHECKED: Dict[str, bool] = {}


def _check_node(work: str, paths: Sequence[str], urls: Sequence[str]) -> None:
    """Before a worker process's first task of a build: its node sees the work folder and
    ``paths`` (an input, the output folder) and reaches ``urls`` (an input, the output in a
    store). A node that cannot would fail every task sent to it, or worse, write to a folder no
    other node reads: the ConfigError naming it stops the build at once (a failure of the
    options is never retried). The tokshuf version and the tokenizer are checked against the
    driver's when the task opens the build's steps."""
    if work in _CHECKED:
        return
    problems = _node_problems([*paths, *([] if is_url(work) else [work])], urls)
    if problems:
        ray = import_ray()
        node = f"node {ray.get_runtime_context().get_node_id()[:8]} ({socket.gethostname()})"
        raise ConfigError("; ".join(f"{node} {p}" for p in problems))
    _CHECKED[work] = True


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
    on_idle: Optional[Callable[[], None]] = None,
) -> StageResult:
    """Run ``tasks`` on the cluster, results by task index; ``on_done`` is called on the driver
    as each finishes (progress, manifest lines), ``on_idle`` when none has for a second. A
    failure that the input or options cause is raised at once with its own type; any other is
    retried up to MAX_ATTEMPTS times."""
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
            done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            if not done:
                if on_idle is not None:
                    on_idle()
                continue
            ref = done[0]
            i, attempt = pending.pop(ref)
            try:
                results[i] = ray.get(ref)
            except Exception as e:
                err = _unwrap(ray, e)
                if isinstance(err, DETERMINISTIC) or attempt + 1 >= MAX_ATTEMPTS:
                    if isinstance(err, TokshufError):
                        raise err from None
                    if isinstance(err, ray.exceptions.RayError) and not isinstance(err, ray.exceptions.RayTaskError):
                        # The cluster's failure, not the task's: a crashed or killed worker, a lost node.
                        raise ClusterError(
                            f"{tasks[i].name}: the cluster failed it on every attempt ({type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else 'no message'}); run the same build again to resume"
                        ) from None
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


# What a task checks of its node (`_check_node`): paths it must see, URLs it must reach.
Probe = Tuple[List[str], List[str]]


def _steps(args: Dict[str, Any], recipe: Optional[str] = None, probe: Optional[Probe] = None) -> Any:
    """The build's steps in this process; ``recipe`` (the driver's, as JSON): no input is
    listed or sized again; ``probe``: what this node must see first (`_check_node`)."""
    from . import _core

    if probe is not None:
        steps = _steps(args, recipe)
        _check_node(steps.work, *probe)
        return steps

    tok = str(args.get("tokenizer", ""))
    stamp = (os.stat(tok).st_size, os.stat(tok).st_mtime_ns) if os.path.isfile(tok) else None
    digest = hashlib.sha256(recipe.encode()).hexdigest() if recipe is not None else None
    key = json.dumps([args, stamp, digest], sort_keys=True, default=str)  # a tokenizer file replaced: reload
    steps = _STEPS.get(key)
    if steps is None:
        if len(_STEPS) >= 4:
            _STEPS.clear()
        steps = _STEPS[key] = _core.BuildSteps(recipe=recipe, **args)
    return steps


def _task_threads() -> int:
    ray = import_ray()
    return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))


def _stage1_task(
    args: Dict[str, Any], recipe: str, probe: Probe, files: List[int], _fault: bool = False
) -> List[Dict[str, int]]:
    """Tokenize ``files`` into their spills; returns a few figures per file (the summaries
    themselves stay on storage for the driver's chunk plan)."""
    if _fault:
        raise OSError(f"injected fault in stage 1, files {files} ({FAULT_ENV})")
    steps = _steps(args, recipe, probe)
    out = []
    for f, text in zip(files, steps.stage1(files, _task_threads())):
        s = json.loads(text)
        out.append({"file": f, "num_tokens": s["num_tokens"], "text_bytes": s["text_bytes"]})
    return out


def _regroup_task(args: Dict[str, Any], recipe: str, probe: Probe, files: List[int], _fault: bool = False) -> List[int]:
    """Rewrite the spills of ``files`` in cell order; returns the files."""
    if _fault:
        raise OSError(f"injected fault in regroup, files {files} ({FAULT_ENV})")
    _steps(args, recipe, probe).regroup(files, _task_threads())
    return files


def _stage2_bin_task(
    args: Dict[str, Any], recipe: str, probe: Probe, k: int, first: int, last: int, _fault: bool = False
) -> List[str]:
    """Unpacked builds: write chunks ``first..last`` of bin ``k``; returns their manifest lines (JSON)."""
    if _fault:
        raise OSError(f"injected fault in stage 2, bin {k} chunks {first}-{last - 1} ({FAULT_ENV})")
    return list(_steps(args, recipe, probe).stage2_bin(k, first, last, _task_threads()))


def _stage2_task(
    args: Dict[str, Any], recipe: str, probe: Probe, first: int, last: int, _fault: bool = False
) -> List[str]:
    """Write chunks ``first..last``; returns their manifest lines (JSON)."""
    if _fault:
        raise OSError(f"injected fault in stage 2, chunks {first}-{last - 1} ({FAULT_ENV})")
    return list(_steps(args, recipe, probe).stage2(first, last, _task_threads()))


def build(args: Dict[str, Any], options: RayOptions, progress: bool) -> Dict[str, Any]:
    """Build (or resume, or confirm) the cache described by ``args`` (the arguments of
    ``_core.BuildSteps``) on the cluster. Returns tokshuf.json."""
    from . import _core

    t0 = time.monotonic()
    # The recipe (the tokenizer loaded, the inputs listed) is made while Ray loads and joins
    # the cluster: BuildSteps releases the GIL, importing Ray mostly holds it.
    planned: Dict[str, Any] = {}

    def plan() -> None:
        try:
            planned["steps"] = _core.BuildSteps(**args)
        except BaseException as e:  # raised on the driver's thread below
            planned["error"] = e

    planner = threading.Thread(target=plan, name="tokshuf-recipe")
    planner.start()
    try:
        session = connect(options.address)
    except BaseException:
        planner.join()
        raise
    try:
        connect_s = time.monotonic() - t0
        cpus = options.cpus_per_task or default_cpus_per_task(session.nodes)
        if not any(n["Resources"].get("CPU", 0) >= cpus for n in session.nodes):
            raise ConfigError(f"no Ray node has {cpus} CPUs for one task; lower threads (CPUs per task)")
        # What every node must see (the output folder exists once `begin` ran) or reach.
        output = os.fspath(args["output"])
        first = [os.fspath(p) for p in args["inputs"][:1]]
        paths = [p for p in [*first, output] if not is_url(p)]
        urls = [u for u in first if is_url(u)] + ([f"{output.rstrip('/')}/tokshuf.json"] if is_url(output) else [])
        planner.join()
        if "error" in planned:
            raise planned["error"]
        steps = planned["steps"]
        record: Dict[str, Any] = {"engine": "ray", "nodes": len(session.nodes), "cpus": session.cpus}
        done_meta = steps.begin(json.dumps(record))
        if done_meta is not None:
            return json.loads(done_meta)
        try:
            bar = _core.Progress(progress)
            try:
                return _run(session, steps, args, options, cpus, bar, t0, connect_s, (paths, urls))
            finally:
                bar.end()  # an error's message then starts on a line of its own
        except BaseException:
            steps.release()
            raise
    finally:
        planner.join()
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
    probe: Probe,
) -> Dict[str, Any]:
    slots = max(1, session.cpus // cpus)
    stages: Dict[str, StageResult] = {}
    # The recipe goes to the cluster once; every task gets a reference to it.
    recipe = session.ray.put(steps.recipe_json)

    # Stage 1: groups of files not done by a killed run.
    sizes = steps.input_sizes()
    done = set(steps.files_done())
    todo = [f for f in range(len(sizes)) if f not in done]
    target = options.task_bytes or default_task_bytes(sum(sizes[f] for f in todo), slots)
    groups = [[todo[i] for i in g] for g in group_files([sizes[f] for f in todo], target)]
    tasks = [
        Task(task_name("stage1", i, len(groups), span(g, "files")), _stage1_task, (args, recipe, probe, g), cpus)
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

    bins = steps.bin_chunks()
    ctx = _Stages(session, steps, args, recipe, options, cpus, slots, bar, probe)
    if bins is not None:
        # Unpacked: no regroup (stage 2 reads examples through each bin's positions).
        stages["write"] = _write_bins(ctx, bins)
    else:
        _regroup(ctx, sizes, stages)
        stages["write"] = _write_chunks(ctx, num_chunks)

    record = build_record(session, cpus, stages, t0)
    record["durations"] = {
        "connect_s": connect_s,
        "tokenize_s": stages["tokenize"].seconds,
        "plan_s": plan_s,
        "regroup_s": stages["regroup"].seconds if "regroup" in stages else 0.0,
        "write_s": stages["write"].seconds,
    }
    record["threads"] = session.cpus
    record["total_s"] = time.monotonic() - t0
    return json.loads(steps.finish(json.dumps(record)))


@dataclass
class _Stages:
    """What the stages after the chunk plan share (the driver's side of `_run`)."""

    session: Session
    steps: Any
    args: Dict[str, Any]
    recipe: Any  # the recipe as a Ray object reference
    options: RayOptions
    cpus: int
    slots: int
    bar: Any
    probe: Probe

    def task(self, stage: str, i: int, count: int, what: str, fn: Callable[..., Any], *extra: Any) -> Task:
        return Task(task_name(stage, i, count, what), fn, (self.args, self.recipe, self.probe, *extra), self.cpus)


def _regroup(
    ctx: _Stages,
    sizes: List[int],
    stages: Dict[str, StageResult],
) -> None:
    """Shuffled builds: every spill (the stitched tails' too) rewritten in cell order, in the
    same groups as stage 1 (a file's spill is about as large as the file)."""
    nspills, regroup = ctx.steps.spills()
    if not regroup:
        return
    spill_sizes = [*sizes, 0][:nspills]
    groups = group_files(spill_sizes, ctx.options.task_bytes or default_task_bytes(sum(spill_sizes), ctx.slots))
    tasks = [ctx.task("regroup", i, len(groups), span(g, "files"), _regroup_task, g) for i, g in enumerate(groups)]
    ctx.bar.stage("regroup", nspills, "spills")
    stages["regroup"] = run_stage(
        ctx.session, "regroup", tasks, lambda i, files: ctx.bar.advance(len(files), sum(spill_sizes[f] for f in files))
    )
    ctx.bar.end()


def _advance(bar: Any, lines: List[str]) -> None:
    parsed = [json.loads(line) for line in lines]
    bar.advance(len(lines), sum(p["bytes"] for p in parsed), sum(p["num_tokens"] for p in parsed))


def _write_chunks(
    ctx: _Stages,
    num_chunks: int,
) -> StageResult:
    """Stage 2 of a packed build: ranges of chunks a killed run did not list."""
    listed = ctx.steps.listed
    per = ctx.options.chunks_per_task or default_chunks_per_task(num_chunks - listed, ctx.slots)
    ranges = [(listed + a, listed + b) for a, b in group_chunks(num_chunks - listed, per)]
    tasks = [
        ctx.task("stage2", i, len(ranges), span([a, b - 1], "chunks"), _stage2_task, a, b)
        for i, (a, b) in enumerate(ranges)
    ]
    ctx.bar.stage("write", num_chunks, "chunks")
    ctx.bar.advance(listed)

    def on_stage2(i: int, lines: List[str]) -> None:
        ctx.steps.add_lines(ranges[i][0], lines)
        _advance(ctx.bar, lines)

    result = run_stage(ctx.session, "stage2", tasks, on_stage2, ctx.steps.upload_manifest)
    ctx.bar.end()
    return result


def _write_bins(
    ctx: _Stages,
    bins: List[int],
) -> StageResult:
    """Stage 2 of an unpacked build: ranges of each bin's chunks (a range never spans two
    bins: each bin is a chunk plan of its own). Every chunk is sent, a killed run's too: its
    bins' manifests appear only at the end, and a task keeps the shards it finds."""
    per = ctx.options.chunks_per_task or default_chunks_per_task(sum(bins), ctx.slots)
    ranges = [(k, a, b) for k, n in enumerate(bins) for a, b in group_chunks(n, per)]
    tasks = [
        ctx.task("stage2", i, len(ranges), f"bin {k} " + span([a, b - 1], "chunks"), _stage2_bin_task, k, a, b)
        for i, (k, a, b) in enumerate(ranges)
    ]
    ctx.bar.stage("write", sum(bins), "chunks")

    def on_stage2(i: int, lines: List[str]) -> None:
        k, first, _ = ranges[i]
        ctx.steps.add_bin_lines(k, first, lines)
        _advance(ctx.bar, lines)

    result = run_stage(ctx.session, "stage2", tasks, on_stage2)
    ctx.bar.end()
    return result


def _partial(session: Session, cpus: int, stages: Dict[str, StageResult], t0: float) -> Dict[str, Any]:
    return build_record(session, cpus, stages, t0)
