"""Running builds from tests: in this process, or in a subprocess that the core's test hooks
(``TOKSHUF_TEST_*``, see the core's ``testhook`` module) trace, pause, gate, slow down, or that
the test kills at a named point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import tokshuf

RUNNER = """
import json, sys, tokshuf
tokshuf.build_cache(json.loads(sys.argv[1]), sys.argv[2], **json.loads(sys.argv[3]))
"""


def build(inputs, out, **opts) -> tokshuf.BuildStats:
    """``tokshuf.build_cache`` without the progress bar."""
    opts.setdefault("progress", False)
    return tokshuf.build_cache(inputs, out, **opts)


def start_build(inputs: List[Path], out: Path, opts: dict, env: Dict[str, str]) -> subprocess.Popen:
    """A build in a subprocess, with `env` added to an environment cleared of test hooks."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TOKSHUF_TEST_")}
    full_env.update(env)
    args = [sys.executable, "-c", RUNNER, json.dumps([str(p) for p in inputs]), str(out), json.dumps(opts)]
    return subprocess.Popen(args, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class BuildProcess:
    """A traced build in a subprocess (the trace lists the named points it reached)."""

    def __init__(self, inputs: List[Path], out: Path, opts: dict, env: Dict[str, str]) -> None:
        self.trace = out.parent / (out.name + ".trace")
        self.trace.write_text("")
        self.proc = start_build(inputs, out, opts, {**env, "TOKSHUF_TEST_TRACE": str(self.trace)})

    def wait_trace(self, line: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.trace.read_text().splitlines():
            if self.proc.poll() is not None:
                raise AssertionError(f"build ended before {line!r}: {self.proc.communicate()[1].decode()}")
            assert time.monotonic() < deadline, f"build never reached {line!r}"
            time.sleep(0.005)

    def finish(self, timeout: float = 120) -> None:
        _, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate()  # also closes the pipes


def run_to_pause(inputs, out, opts, point: str, trace: Path, timeout: float = 60) -> Optional[str]:
    """Start a build that stops at `point`; SIGKILL it there. Returns the point it was killed
    at, or None when the build finished without reaching it."""
    trace.write_text("")
    proc = start_build(inputs, out, opts, {"TOKSHUF_TEST_TRACE": str(trace), "TOKSHUF_TEST_PAUSE": point})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            lines = trace.read_text().splitlines()
            paused = [line[len("paused ") :] for line in lines if line.startswith("paused ")]
            if paused:
                proc.send_signal(signal.SIGKILL)
                proc.communicate()  # also closes the pipes
                return point
            if proc.poll() is not None:
                _, err = proc.communicate()
                assert proc.returncode == 0, err.decode()
                return None
            time.sleep(0.005)
        raise AssertionError(f"build neither paused at {point} nor finished")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # also closes the pipes


def run_and_kill_after(inputs, out, opts, delay: float) -> bool:
    """Start a build and SIGKILL it after `delay` seconds; True if it was still running."""
    proc = start_build(inputs, out, opts, {})
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()  # also closes the pipes
        return True
    _, err = proc.communicate()
    assert proc.returncode == 0, err.decode()
    return False
