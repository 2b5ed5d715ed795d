"""examples/: the JAX and PyTorch training loops run on CPU, resume from their checkpoints with the
same losses as an uninterrupted run, and (JAX) read the same global batches through Grain and
across two processes. Each is skipped, with the reason, where its framework is not installed
(PyTorch from PyPI brings CUDA on Linux, so CI does not install it)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import tokshuf

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "sample"


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("examples") / "cache"
    tokshuf.build_cache(SAMPLE, out, seqlen=129, chunk_size=256, progress=False)
    return out


def run(script: str, *args: object, cwd: Path) -> List[str]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def losses(lines: List[str]) -> dict:
    return {int(m[1]): m[2] for line in lines if (m := re.fullmatch(r"step (\d+) loss (\S+)", line))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- JAX -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jax_straight(cache, tmp_path_factory):
    pytest.importorskip("jax", reason="jax is not installed (pip install 'jax[cpu]')")
    got = losses(run("jax_train_loop.py", "--cache", cache, "--steps", 6, cwd=tmp_path_factory.mktemp("jax")))
    assert sorted(got) == list(range(6))
    return got


def test_jax_loop_resumes_from_its_checkpoint(cache, jax_straight, tmp_path):
    ck = tmp_path / "ck"
    first = run("jax_train_loop.py", "--cache", cache, "--steps", 3, "--checkpoint", ck, cwd=tmp_path)
    assert "checkpoint at step 3" in first
    second = losses(run("jax_train_loop.py", "--cache", cache, "--steps", 6, "--checkpoint", ck, cwd=tmp_path))
    assert sorted(second) == [3, 4, 5]  # started from the checkpoint, not from step 0
    assert {**losses(first), **second} == jax_straight


def test_jax_loop_through_grain_reads_the_same_batches(cache, jax_straight, tmp_path):
    pytest.importorskip("grain", reason="grain is not installed (pip install grain)")
    ck = tmp_path / "ck"
    first = losses(
        run("jax_train_loop.py", "--cache", cache, "--steps", 4, "--checkpoint", ck, "--loader", "grain", cwd=tmp_path)
    )
    rest = losses(
        run("jax_train_loop.py", "--cache", cache, "--steps", 6, "--checkpoint", ck, "--loader", "grain", cwd=tmp_path)
    )
    assert sorted(rest) == [4, 5]
    assert {**first, **rest} == jax_straight


@pytest.mark.slow
def test_jax_loop_on_two_processes_then_one(cache, jax_straight, tmp_path):
    """Two jax.distributed processes each read half of every global batch: the losses are those
    of one process (to float rounding: the mean is reduced across devices), and their checkpoint
    resumes in a single process at the global position."""
    ck, port = tmp_path / "ck", free_port()
    script = ROOT / "examples" / "jax_train_loop.py"
    common = ["--cache", cache, "--steps", 4, "--checkpoint", ck, "--checkpoint-every", 4]
    common += ["--coordinator", f"127.0.0.1:{port}", "--num-processes", 2, "--process-id"]
    procs = [
        subprocess.Popen(
            [sys.executable, script, *map(str, [*common, p])],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    for out, _ in outs:
        got = losses(out.splitlines())
        assert sorted(got) == [0, 1, 2, 3]
        for step, loss in got.items():
            assert float(loss) == pytest.approx(float(jax_straight[step]), rel=1e-5)
    rest = losses(run("jax_train_loop.py", "--cache", cache, "--steps", 6, "--checkpoint", ck, cwd=tmp_path))
    assert sorted(rest) == [4, 5]
    for step, loss in rest.items():
        assert float(loss) == pytest.approx(float(jax_straight[step]), rel=1e-5)


# ---- PyTorch ---------------------------------------------------------------------------------
def test_torch_loop_resumes_from_its_checkpoint(cache, tmp_path):
    pytest.importorskip("torch", reason="torch is not installed (PyPI's Linux wheels bring CUDA; CI leaves it out)")
    straight = losses(run("torch_train_loop.py", "--cache", cache, "--steps", 6, "--workers", 2, cwd=tmp_path))
    assert sorted(straight) == list(range(6))
    ck = tmp_path / "ck"
    first = losses(run("torch_train_loop.py", "--cache", cache, "--steps", 3, "--checkpoint", ck, cwd=tmp_path))
    rest = losses(
        run("torch_train_loop.py", "--cache", cache, "--steps", 6, "--checkpoint", ck, "--workers", 0, cwd=tmp_path)
    )
    assert sorted(rest) == [3, 4, 5]
    assert {**first, **rest} == straight
