"""The storage layer against a real S3-protocol server on loopback (moto), through a proxy that
injects faults on a seeded schedule: listing, streaming reads that survive dropped, throttled and
stalled connections, whole-object uploads that are never half visible, typed errors that name the
URL and hold no secret."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tokshuf
from support import faultproxy
from support.s3 import S3, TEST_ENV, every_get, parts_only, uploads
from tokshuf import ConfigError, InputNotFoundError, RemoteError, TokshufIOError, _core


def random_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def multi_member_gzip(parts: list) -> bytes:
    return b"".join(gzip.compress(p, mtime=0) for p in parts)


def multi_frame_zstd(parts: list) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    return b"".join(zstandard.ZstdCompressor(level=1).compress(p) for p in parts)


def jsonl_lines(n: int, seed: int) -> bytes:
    rng = random.Random(seed)
    return b"".join(b'{"text": "%d %s"}\n' % (i, rng.randbytes(40).hex().encode()) for i in range(n))


# -- listing ----------------------------------------------------------------------------------


def test_list_prefix_recursive_sorted_and_globs(s3: S3) -> None:
    for key in [
        "data/b.jsonl",
        "data/a.jsonl.gz",
        "data/sub/c.jsonl.zst",
        "data/sub/d.txt",
        "data2/x.jsonl",
        "other/y",
    ]:
        s3.put(key, key.encode())
    got = _core._storage_list(s3.url("data"))
    assert got == [
        (s3.url(k), len(k)) for k in ["data/a.jsonl.gz", "data/b.jsonl", "data/sub/c.jsonl.zst", "data/sub/d.txt"]
    ]
    assert _core._storage_list(s3.url("data/")) == got
    assert [u for u, _ in _core._storage_list(s3.url("data/*.jsonl*"))] == [
        s3.url("data/a.jsonl.gz"),
        s3.url("data/b.jsonl"),
    ]
    assert [u for u, _ in _core._storage_list(s3.url("data/**/*.zst"))] == [s3.url("data/sub/c.jsonl.zst")]
    assert [u for u, _ in _core._storage_list(s3.url("data*/*.jsonl"))] == [
        s3.url("data/b.jsonl"),
        s3.url("data2/x.jsonl"),
    ]
    # One object named exactly; a prefix with nothing under it.
    assert _core._storage_list(s3.url("data/b.jsonl")) == [(s3.url("data/b.jsonl"), len("data/b.jsonl"))]
    assert _core._storage_list(s3.url("nothing/here")) == []
    # The whole bucket.
    assert len(_core._storage_list(s3.url())) == 6


def test_list_many_pages_under_faults(s3: S3) -> None:
    keys = [f"many/{i:05d}.jsonl" for i in range(1100)]  # more than one page of 1000
    s3.put_many(keys, b"x")
    proxy = s3.faults(seed=3, rate=0.5, kinds=("slowdown", "drop", "reset"))
    got = _core._storage_list(s3.url("many"))
    assert [u for u, _ in got] == [s3.url(k) for k in keys]
    assert sum(n for f, n in proxy.faults.items() if f != "ok") > 0


# -- streaming reads --------------------------------------------------------------------------


def test_read_whole_object_and_ranges(s3: S3) -> None:
    data = random_bytes(3 << 20, 1)
    url = s3.put("blob.bin", data)
    assert _core._storage_read(url) == data
    assert _core._storage_head(url) == len(data)
    assert _core._storage_get_range(url, 12345, 1 << 20) == data[12345 : 1 << 20]
    assert _core._storage_get_range(url, len(data) - 10, len(data)) == data[-10:]
    with pytest.raises(RemoteError, match=r"blob\.bin"):
        _core._storage_get_range(url, len(data) - 10, len(data) + 10)
    empty = s3.put("empty.jsonl", b"")
    assert _core._storage_read(empty) == b""


def test_multi_member_gzip_and_multi_frame_zstd_read_to_the_end(s3: S3) -> None:
    parts = [jsonl_lines(3000, seed) for seed in range(5)]
    whole = b"".join(parts)
    gz = s3.put("in/a.jsonl.gz", multi_member_gzip(parts))
    zst = s3.put("in/b.jsonl.zst", multi_frame_zstd(parts))
    assert _core._storage_read(gz, decompress=True) == whole
    assert _core._storage_read(zst, decompress=True) == whole
    # Also through a schedule of faults: every resumed range lands in the right place.
    s3.faults(seed=11, rate=0.4, kinds=("drop", "slowdown"), match=every_get)
    assert _core._storage_read(gz, decompress=True) == whole
    assert _core._storage_read(zst, decompress=True) == whole


@pytest.mark.parametrize("seed", [1, 2])
def test_seeded_faults_on_reads_still_give_identical_bytes(s3: S3, seed: int) -> None:
    data = random_bytes(6 << 20, seed)
    url = s3.put("blob.bin", data)
    proxy = s3.faults(seed=seed, rate=0.35, match=every_get, kinds=("drop", "slowdown", "stall", "reset"))
    assert _core._storage_read(url) == data
    assert _core._storage_get_range(url, 1000, 5 << 20) == data[1000 : 5 << 20]
    injected = {k: n for k, n in proxy.faults.items() if k != "ok"}
    assert injected, proxy.log


def test_body_cut_short_on_every_request_resumes_from_its_offset(s3: S3) -> None:
    data = random_bytes(1 << 20, 5)
    url = s3.put("blob.bin", data)
    proxy = s3.faults(every=True, kinds=("drop",), match=every_get)
    # Each response delivers half of what is left and is then cut: never taken for the end.
    assert _core._storage_read(url) == data
    assert proxy.faults["drop"] >= 10
    ranges = [t for m, t, _ in proxy.log if m == "GET"]
    assert len(set(ranges)) == len(ranges) or len(ranges) > 1


def test_faults_on_every_read_try_give_a_typed_error_naming_the_url(s3: S3) -> None:
    url = s3.put("dir/blob.bin", random_bytes(1000, 1))
    # Throttled, refused, or silent (no reply within the timeout) on every try.
    for kind in ("slowdown", "reset", "hang"):
        s3.faults(every=True, kinds=(kind,), match=every_get)
        start = time.monotonic()
        with pytest.raises(RemoteError) as err:
            _core._storage_read(url)
        assert url in str(err.value), kind
        assert isinstance(err.value, TokshufIOError) and isinstance(err.value, OSError)
        assert time.monotonic() - start < 30


def test_missing_object_and_bucket_are_not_found(s3: S3) -> None:
    with pytest.raises(InputNotFoundError, match="nope"):
        _core._storage_read(s3.url("nope.jsonl"))
    with pytest.raises(InputNotFoundError):
        _core._storage_head(s3.url("nope.jsonl"))
    _core._storage_delete(s3.url("nope.jsonl"))  # already gone is fine


def test_errors_never_print_credentials(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    url = s3.put("blob.bin", b"abc")
    # A store whose error body echoes the access key id (real S3 does, for a bad key).
    s3.faults(every=True, kinds=("slowdown",), match=every_get)
    monkeypatch.setattr(
        faultproxy,
        "SLOWDOWN_BODY",
        b"<Error><Code>SlowDown</Code><AWSAccessKeyId>"
        + TEST_ENV["AWS_ACCESS_KEY_ID"].encode()
        + b"</AWSAccessKeyId></Error>",
    )
    with pytest.raises(RemoteError) as err:
        _core._storage_read(url)
    msg = str(err.value)
    assert "SlowDown" in msg and url in msg
    assert TEST_ENV["AWS_ACCESS_KEY_ID"] not in msg
    assert TEST_ENV["AWS_SECRET_ACCESS_KEY"] not in msg


# -- uploads ----------------------------------------------------------------------------------


def test_put_small_and_multipart(s3: S3, tmp_path: Path) -> None:
    small = tmp_path / "small.tar"
    small.write_bytes(random_bytes(100_000, 1))
    big = tmp_path / "big.tar"
    big.write_bytes(random_bytes(12 << 20, 2))  # three parts of 5 MiB
    _core._storage_put(str(small), s3.url("out/small.tar"))
    _core._storage_put(str(big), s3.url("out/big.tar"))
    assert s3.get("out/small.tar") == small.read_bytes()
    assert s3.get("out/big.tar") == big.read_bytes()
    head = s3.client.head_object(Bucket=s3.bucket, Key="out/big.tar")
    assert head["ETag"].strip('"').endswith("-3")  # really a multipart upload
    assert s3.pending_uploads() == []
    # Overwriting replaces the whole object.
    _core._storage_put(str(small), s3.url("out/big.tar"))
    assert s3.get("out/big.tar") == small.read_bytes()
    _core._storage_delete(s3.url("out/big.tar"))
    assert s3.keys("out/") == ["out/small.tar"]


@pytest.mark.parametrize("seed", [4, 5])
def test_seeded_faults_on_uploads_still_give_identical_objects(s3: S3, tmp_path: Path, seed: int) -> None:
    small = tmp_path / "small.tar"
    small.write_bytes(random_bytes(300_000, seed))
    big = tmp_path / "big.tar"
    big.write_bytes(random_bytes(11 << 20, seed))
    proxy = s3.faults(seed=seed, rate=0.3, match=uploads)
    _core._storage_put(str(small), s3.url("out/small.tar"))
    _core._storage_put(str(big), s3.url("out/big.tar"))
    assert sum(n for f, n in proxy.faults.items() if f != "ok") > 0, proxy.log
    s3.no_faults()
    assert s3.get("out/small.tar") == small.read_bytes()
    assert s3.get("out/big.tar") == big.read_bytes()
    assert s3.pending_uploads() == []


@pytest.mark.parametrize("kind", ["slowdown", "reset", "hang"])
def test_faults_on_every_upload_try_leave_nothing_visible(
    s3: S3, tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    small = tmp_path / "small.tar"
    small.write_bytes(random_bytes(1000, 1))
    big = tmp_path / "big.tar"
    big.write_bytes(random_bytes(11 << 20, 2))
    monkeypatch.setenv("TOKSHUF_REMOTE_RETRIES", "1")  # each try of a hang costs a timeout
    s3.faults(every=True, kinds=(kind,), match=uploads)
    for f in (small, big):
        url = s3.url(f"out/{f.name}")
        with pytest.raises(RemoteError) as err:
            _core._storage_put(str(f), url)
        assert url in str(err.value)
    s3.no_faults()
    assert s3.keys() == []
    # Parts failing after the upload began: it is aborted, not left open.
    s3.faults(every=True, kinds=(kind,), match=parts_only)
    with pytest.raises(RemoteError):
        _core._storage_put(str(big), s3.url("out/big.tar"))
    s3.no_faults()
    assert s3.keys() == []
    assert s3.pending_uploads() == []


def test_lost_reply_to_completion_is_not_an_error(s3: S3, tmp_path: Path) -> None:
    big = tmp_path / "big.tar"
    big.write_bytes(random_bytes(11 << 20, 3))
    done = []

    def completion(method: str, target: str) -> bool:
        # The first completion request is processed by the server, but its reply is lost.
        hit = method == "POST" and "uploadId=" in target and not done
        if hit:
            done.append(target)
        return hit

    proxy = s3.faults(every=True, kinds=("drop",), match=completion)
    _core._storage_put(str(big), s3.url("out/big.tar"))
    assert proxy.faults["drop"] == 1
    assert s3.get("out/big.tar") == big.read_bytes()


# -- process handling -------------------------------------------------------------------------


def test_forked_child_gets_its_own_runtime(s3: S3) -> None:
    data = random_bytes(200_000, 9)
    url = s3.put("blob.bin", data)
    assert _core._storage_read(url) == data  # the parent's runtime is running now
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            ok = _core._storage_read(url) == data
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung using the storage layer")
    with open(r, "rb") as f:
        assert f.read() == b"1"


def test_local_paths_through_the_same_api(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "b.jsonl").write_bytes(b"bb")
    (tmp_path / "d" / "sub" / "a.jsonl").write_bytes(b"a")
    got = _core._storage_list(str(tmp_path / "d"))
    assert got == [(str(tmp_path / "d" / "b.jsonl"), 2), (str(tmp_path / "d" / "sub" / "a.jsonl"), 1)]
    assert [u for u, _ in _core._storage_list(str(tmp_path / "d" / "**" / "a.jsonl"))] == [
        str(tmp_path / "d" / "sub" / "a.jsonl")
    ]
    dest = tmp_path / "out" / "x.jsonl"
    dest.parent.mkdir()
    _core._storage_put(str(tmp_path / "d" / "b.jsonl"), str(dest))
    assert dest.read_bytes() == b"bb"
    assert _core._storage_get_range(str(dest), 1, 2) == b"b"
    with pytest.raises(ConfigError, match="unsupported URL scheme"):
        _core._storage_read("http://example.invalid/x")


# -- publishing a cache -----------------------------------------------------------------------


def test_publish_resumes_after_sigkill_mid_upload(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "cache"
    tokshuf.build_cache(small_corpus, local, seqlen=64, chunk_size=16, progress=False)
    shards = sorted(p.name for p in local.glob("shard_*.tar"))
    assert len(shards) >= 4
    url = s3.url("caches/one")
    # Shard 2's upload never gets an answer: the publisher is killed while waiting for it.
    stuck = f"caches/one/{shards[2]}"
    s3.proxy.stall_s = 60
    proxy = s3.faults(every=True, kinds=("hang",), match=lambda m, t: m == "PUT" and stuck in t)
    env = {**os.environ, "TOKSHUF_REMOTE_TIMEOUT": "60"}
    code = "import sys; from tokshuf import _core; _core._storage_publish(sys.argv[1], sys.argv[2])"
    child = subprocess.Popen([sys.executable, "-c", code, str(local), url], env=env)
    try:
        deadline = time.monotonic() + 60
        while not proxy.faults["hang"] and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert proxy.faults["hang"], "the publisher never reached shard 2"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    s3.no_faults()
    seen = s3.keys("caches/one/")
    assert f"caches/one/{shards[2]}" not in seen
    # Not complete; a manifest, if one is there yet, lists only shards in the store.
    assert json.loads(s3.get("caches/one/tokshuf.json"))["status"] == "writing"
    if "caches/one/manifest.jsonl" in seen:
        assert s3.get("caches/one/manifest.jsonl").count(b"\n") <= 2
    uploaded, skipped = _core._storage_publish(str(local), url)
    assert skipped == shards[:2]
    assert uploaded == shards[2:]
    for f in [*shards, "manifest.jsonl", "tokshuf.json"]:
        assert s3.get(f"caches/one/{f}") == (local / f).read_bytes(), f
    # Published and complete: running it again uploads nothing.
    assert _core._storage_publish(str(local), url) == ([], shards)
