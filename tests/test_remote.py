"""Builds and caches in an object store (DESIGN.md section 10), against the loopback S3 server:
a build whose output is s3:// gives the same bytes as the same build on local disk, survives
faults, and resumes after a failed upload without redoing what is already there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokshuf
from support.s3 import S3, uploads

OPTS = dict(seqlen=64, chunk_size=16, progress=False)


def same_cache(s3: S3, prefix: str, local: Path) -> None:
    """Every file of the local cache is an identical object under ``prefix`` (tokshuf.json: but
    for the run's own ``build`` figures), and nothing else is there."""
    names = sorted(p.name for p in local.iterdir() if p.is_file() and not p.name.startswith("."))
    assert sorted(k.rsplit("/", 1)[1] for k in s3.keys(prefix + "/")) == names
    for name in names:
        got = s3.get(f"{prefix}/{name}")
        if name == "tokshuf.json":
            a, b = json.loads(got), json.loads((local / name).read_bytes())
            a.pop("build"), b.pop("build")
            assert a == b
        else:
            assert got == (local / name).read_bytes(), name


def test_build_to_s3_equals_the_local_build(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    stats = tokshuf.build_cache(small_corpus, s3.url("caches/a"), local_cell_dir=tmp_path / "scratch", **OPTS)
    assert stats.output == s3.url("caches/a")
    assert json.loads(s3.get("caches/a/tokshuf.json"))["status"] == "complete"
    same_cache(s3, "caches/a", local)
    # The staging copy is gone once published; scratch stays on local disk only.
    assert not any((tmp_path / "scratch").glob("tokshuf-staging-*"))


def test_build_to_s3_under_upload_faults(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    proxy = s3.faults(seed=7, rate=0.3, match=uploads)
    tokshuf.build_cache(small_corpus, s3.url("caches/b"), local_cell_dir=tmp_path / "scratch", **OPTS)
    assert sum(n for f, n in proxy.faults.items() if f != "ok") > 0
    s3.no_faults()
    same_cache(s3, "caches/b", local)


def test_failed_upload_resumes_and_skips_what_is_there(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    shards = sorted(p.name for p in local.glob("shard_*.tar"))
    assert len(shards) >= 4
    url = s3.url("caches/c")
    s3.faults(every=True, kinds=("slowdown",), match=lambda m, t: m == "PUT" and shards[2] in t)
    with pytest.raises(tokshuf.RemoteError, match=shards[2].replace(".", r"\.")):
        tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", **OPTS)
    # Nothing claims to be complete; the staging copy waits for the next run.
    assert json.loads(s3.get("caches/c/tokshuf.json"))["status"] == "building"
    assert "caches/c/manifest.jsonl" not in s3.keys("caches/c/")
    assert any((tmp_path / "scratch").glob("tokshuf-staging-*"))
    proxy = s3.faults(seed=0, rate=0.0)
    tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", **OPTS)
    put_shards = sorted({t.split("?")[0].rsplit("/", 1)[1] for m, t, _ in proxy.log if m == "PUT" and "shard_" in t})
    assert put_shards == shards[2:]
    same_cache(s3, "caches/c", local)


def test_another_cache_at_the_url_is_not_overwritten(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    url = s3.url("caches/d")
    tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", **OPTS)
    with pytest.raises(tokshuf.OutputExistsError):
        tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", seed=5, **OPTS)
    tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", seed=5, overwrite=True, **OPTS)
    assert json.loads(s3.get("caches/d/tokshuf.json"))["seed"] == 5
