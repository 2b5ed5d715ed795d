"""Disk full: a clear DiskFullError naming the path, nothing published is harmed, and the same
build resumes to a byte-identical cache once there is space again.

Two ways to fill the disk: the core's test-only hook TOKSHUF_TEST_FAIL_AFTER_BYTES (every write
fails with ENOSPC after that many bytes; works everywhere), and a real 1 MiB tmpfs (only where
the test may mount one, e.g. as root in a container)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import tokshuf
from support.cache import assert_same_cache, file_bytes
from support.corpus import parts

OPTS = dict(seqlen=32, chunk_size=64, threads=2, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("diskfull")
    return parts(root, 4, docs=150, step=60, seed=200)


def bytes_written(out: Path) -> int:
    """Roughly what a build writes: its spills (as big as the shard data) and its cache."""
    meta = json.loads((out / "tokshuf.json").read_text())
    return meta["num_contexts"] * meta["seqlen"] * 2 + sum(p.stat().st_size for p in out.iterdir())


def assert_nothing_harmed(out: Path, want: Path) -> None:
    """Every file the failed build published is a file of the finished cache (or tokshuf.json /
    manifest.jsonl of a build in progress); no temporary file is left behind."""
    assert not list(out.rglob("*.tmp*"))
    good = file_bytes(want)
    for name, data in file_bytes(out).items():
        if name.startswith("shard_"):
            assert data == good[name], name
    meta = json.loads((out / "tokshuf.json").read_text())
    assert meta["status"] in ("building", "streaming", "writing", "complete")
    listed = (out / "manifest.jsonl").read_text().splitlines() if (out / "manifest.jsonl").exists() else []
    assert listed == (want / "manifest.jsonl").read_text().splitlines()[: len(listed)]


@pytest.fixture(scope="module")
def clean(corpus, tmp_path_factory):
    """Uninterrupted builds to compare with, by `shuffle`."""
    root = tmp_path_factory.mktemp("clean")
    return {
        s: tokshuf.build_cache(corpus, root / str(s), **dict(OPTS, shuffle=s)) and root / str(s) for s in (True, False)
    }


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "streaming"])
@pytest.mark.parametrize("share", [0.02, 0.5, 0.97])
def test_injected_disk_full_is_reported_and_resumes(corpus, clean, tmp_path, monkeypatch, shuffle, share):
    opts = dict(OPTS, shuffle=shuffle)
    want = clean[shuffle]
    out = tmp_path / "cache"
    monkeypatch.setenv("TOKSHUF_TEST_FAIL_AFTER_BYTES", str(int(bytes_written(want) * share)))
    with pytest.raises(tokshuf.DiskFullError) as e:
        tokshuf.build_cache(corpus, out, **opts)
    assert str(out) in str(e.value) and "no space left on device" in str(e.value)
    assert isinstance(e.value, OSError)
    assert_nothing_harmed(out, want)
    # Still full: fails again, harms nothing.
    monkeypatch.setenv("TOKSHUF_TEST_FAIL_AFTER_BYTES", "0")
    with pytest.raises(tokshuf.DiskFullError):
        tokshuf.build_cache(corpus, out, **opts)
    assert_nothing_harmed(out, want)
    monkeypatch.delenv("TOKSHUF_TEST_FAIL_AFTER_BYTES")
    tokshuf.build_cache(corpus, out, **opts)
    assert_same_cache(out, want)


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs, or a skip where mounting is not permitted."""
    mnt = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "streaming"])
def test_real_full_filesystem_is_reported_and_resumes(corpus, clean, small_fs, shuffle):
    opts = dict(OPTS, shuffle=shuffle)
    want = clean[shuffle]
    assert bytes_written(want) > 2 << 20, "the cache must not fit in the small filesystem"
    out = small_fs / "cache"
    with pytest.raises(tokshuf.DiskFullError) as e:
        tokshuf.build_cache(corpus, out, **opts)
    assert str(small_fs) in str(e.value)
    assert_nothing_harmed(out, want)
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_fs)], check=True)
    tokshuf.build_cache(corpus, out, **opts)
    assert_same_cache(out, want)
