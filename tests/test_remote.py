"""Builds and caches in an object store (DESIGN.md section 10), against the loopback S3 server:
a build whose output is s3:// gives the same bytes as the same build on local disk, survives
faults, and resumes after a failed upload without redoing what is already there."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
import tokshuf
from support.cache import same_except_input_names
from support.corpus import multi_member_inputs, three_files
from support.s3 import S3, every_get, uploads
from support.steps import drive, step_args
from tokshuf import _core
from tokshuf._cli_status import build_status

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
    assert json.loads(s3.get("caches/c/tokshuf.json"))["status"] == "writing"
    # A manifest, if one is there yet, lists only shards in the store.
    if "caches/c/manifest.jsonl" in s3.keys("caches/c/"):
        listed = [json.loads(line)["shard"] for line in s3.get("caches/c/manifest.jsonl").splitlines()]
        assert all(f"caches/c/{s}.tar" in s3.keys("caches/c/") for s in listed) and len(listed) < len(shards)
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
    # Overwritten by a cache of fewer shards: nothing of the old one is left.
    other = dict(OPTS, chunk_size=64)
    tokshuf.build_cache(small_corpus, url, local_cell_dir=tmp_path / "scratch", seed=5, overwrite=True, **other)
    tokshuf.build_cache(small_corpus, tmp_path / "local", seed=5, **other)
    same_cache(s3, "caches/d", tmp_path / "local")


def test_output_mistakes_are_refused_before_the_build(s3: S3, tmp_path: Path, small_corpus: list, monkeypatch) -> None:
    scratch = tmp_path / "scratch"
    s3.put("caches/e/notes.txt", b"someone's")
    with pytest.raises(tokshuf.OutputExistsError, match=r"notes\.txt"):
        tokshuf.build_cache(small_corpus, s3.url("caches/e"), local_cell_dir=scratch, overwrite=True, **OPTS)
    # Another build renews its lease there (written now, by a process elsewhere).
    lease = {"host": "elsewhere", "pid": 1, "renewed_ms": int(time.time() * 1000)}
    s3.put("caches/f/.tokshuf-lock", json.dumps(lease).encode())
    with pytest.raises(tokshuf.OutputExistsError, match="another tokshuf build is writing"):
        tokshuf.build_cache(small_corpus, s3.url("caches/f"), local_cell_dir=scratch, overwrite=True, **OPTS)
    with pytest.raises(tokshuf.ConfigError, match="unpacked"):
        tokshuf.build_cache(small_corpus, s3.url("caches/g"), local_cell_dir=scratch, packing="none", **OPTS)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "127.0.0.1:9")  # no scheme: object_store would panic
    with pytest.raises(tokshuf.ConfigError, match="not an http:// or https:// URL"):
        tokshuf.build_cache(small_corpus, s3.url("caches/h"), local_cell_dir=scratch, **OPTS)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://192.0.2.1:9")  # not loopback, not allowed
    with pytest.raises(tokshuf.ConfigError, match="AWS_ALLOW_HTTP"):
        tokshuf.build_cache(small_corpus, s3.url("caches/h"), local_cell_dir=scratch, **OPTS)
    assert not scratch.exists()  # nothing was built


def test_unknown_schemes_are_refused_and_file_urls_are_paths(tmp_path: Path, small_corpus: list) -> None:
    for url in ("gcs://bucket/x", "S3://bucket/x", "http://host/x"):
        with pytest.raises(tokshuf.ConfigError, match="unsupported URL scheme"):
            tokshuf.build_cache(small_corpus, url, **OPTS)
    stats = tokshuf.build_cache([f"file://{p}" for p in small_corpus], f"file://{tmp_path / 'c'}", **OPTS)
    assert (tmp_path / "c" / "tokshuf.json").exists() and stats.metadata["status"] == "complete"
    assert len(tokshuf.Cache(f"file://{tmp_path / 'c'}")) == len(tokshuf.Cache(tmp_path / "c"))
    assert tokshuf.verify(f"file://{tmp_path / 'c'}").ok


# -- inputs in a store ------------------------------------------------------------------------


def upload_all(s3: S3, files: List[Path], prefix: str) -> None:
    for f in files:
        s3.put(f"{prefix}/{f.name}", f.read_bytes())


def test_build_from_s3_inputs_equals_the_local_build(s3: S3, tmp_path: Path) -> None:
    files = multi_member_inputs(tmp_path / "in")
    upload_all(s3, files, "corpus/part1")
    tokshuf.build_cache(files, tmp_path / "local", **OPTS)
    # A cache under the prefix is not input: its manifest.jsonl is not text.
    upload_all(s3, [tmp_path / "local" / n for n in ("tokshuf.json", "manifest.jsonl")], "corpus/cache")
    stats = tokshuf.build_cache(s3.url("corpus"), tmp_path / "remote", **OPTS)
    assert [f["path"] for f in stats.metadata["inputs"]] == [s3.url(f"corpus/part1/{f.name}") for f in files]
    same_except_input_names(tmp_path / "local", tmp_path / "remote")
    # Every member and frame was read: the multi-member files count all their documents.
    assert stats.num_documents == json.loads((tmp_path / "local" / "tokshuf.json").read_text())["num_documents"]


def test_build_from_s3_into_s3_under_faults(s3: S3, tmp_path: Path) -> None:
    files = multi_member_inputs(tmp_path / "in")
    upload_all(s3, files, "corpus")
    tokshuf.build_cache(files, tmp_path / "local", **OPTS)
    proxy = s3.faults(seed=21, rate=0.3, kinds=("drop", "slowdown", "reset"))
    tokshuf.build_cache(s3.url("corpus/*.jsonl*"), s3.url("caches/x"), local_cell_dir=tmp_path / "scratch", **OPTS)
    assert sum(n for f, n in proxy.faults.items() if f != "ok") > 0
    s3.no_faults()
    got = tmp_path / "got"
    got.mkdir()
    for key in s3.keys("caches/x/"):
        (got / key.rsplit("/", 1)[1]).write_bytes(s3.get(key))
    same_except_input_names(tmp_path / "local", got)


def test_mixed_local_and_s3_inputs_in_sorted_order(s3: S3, tmp_path: Path) -> None:
    files = three_files(tmp_path / "in")
    upload_all(s3, files[1:], "corpus")
    stats = tokshuf.build_cache([s3.url("corpus"), files[0]], tmp_path / "out", **OPTS)
    names = [f["path"] for f in stats.metadata["inputs"]]
    # URLs as given, local files relative to their folder: sorted together.
    assert names == sorted([files[0].name, *(s3.url(f"corpus/{f.name}") for f in files[1:])])
    with pytest.raises(tokshuf.InputNotFoundError, match="nothing"):
        tokshuf.build_cache(s3.url("nothing/"), tmp_path / "none", **OPTS)


def test_store_failing_on_every_read_is_a_remote_error_even_when_skipping(s3: S3, tmp_path: Path) -> None:
    files = three_files(tmp_path / "in")
    upload_all(s3, files, "corpus")
    s3.faults(every=True, kinds=("slowdown",), match=every_get)
    with pytest.raises(tokshuf.RemoteError, match=r"s3://.*corpus"):
        tokshuf.build_cache(s3.url("corpus"), tmp_path / "out", errors="skip", **OPTS)
    assert json.loads((tmp_path / "out" / "tokshuf.json").read_text())["status"] != "complete"


# -- reading a cache in a store ---------------------------------------------------------------


def shard_gets(proxy: Any) -> int:
    return sum(1 for m, t, _ in proxy.log if m == "GET" and "shard_" in t)


def batches(cache: tokshuf.Cache, n: int) -> List[bytes]:
    r = tokshuf.Reader(cache, batch_size=8, seed=3, prefetch=0)
    return [next(r).tobytes() for _ in range(n)]


def test_remote_cache_gives_the_local_batches_cold_and_warm_within_budget(
    s3: S3, tmp_path: Path, small_corpus: list
) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    sizes = [p.stat().st_size for p in local.glob("shard_*.tar")]
    assert len(sizes) >= 4
    url = s3.url("caches/r")
    tokshuf._core._storage_publish(str(local), url)
    n = 2 * len(tokshuf.Cache(local)) // 8  # two epochs: every shard read twice
    want = batches(tokshuf.Cache(local), n)

    # A budget of two shards: shards come and go, batches stay the same.
    small = tmp_path / "small"
    proxy = s3.faults(seed=0, rate=0.0)
    with pytest.warns(UserWarning, match="downloaded again and again"):
        assert batches(tokshuf.Cache(url, cache_dir=small, cache_limit=2 * max(sizes)), n) == want
    held = sum(p.stat().st_size for p in small.rglob("shard_*.tar"))
    assert 0 < held <= 2 * max(sizes)
    assert shard_gets(proxy) > len(sizes)  # some were fetched again after eviction

    # Room for all: the first reader downloads each shard once, a second one none.
    roomy = tmp_path / "roomy"
    proxy = s3.faults(seed=0, rate=0.0)
    assert batches(tokshuf.Cache(url, cache_dir=roomy, cache_limit=10 * sum(sizes)), n) == want
    assert shard_gets(proxy) == len(sizes)
    proxy = s3.faults(seed=0, rate=0.0)
    assert batches(tokshuf.Cache(url, cache_dir=roomy, cache_limit=10 * sum(sizes)), n) == want
    assert shard_gets(proxy) == 0

    # Under faults: the same batches.
    s3.faults(seed=5, rate=0.3, kinds=("drop", "slowdown", "reset"), match=every_get)
    assert batches(tokshuf.Cache(url, cache_dir=tmp_path / "faulty"), n) == want


def test_two_caches_sharing_a_folder_and_a_budget(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    """A cache evicting shards from a shared folder, another fetching the same ones ahead at the
    same time (two caches of one process): each gets the local batches, never a missing file."""
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/shared")
    tokshuf._core._storage_publish(str(local), url)
    size = max(p.stat().st_size for p in local.glob("shard_*.tar"))
    n = 3 * len(tokshuf.Cache(local)) // 8
    want = tokshuf.Reader(tokshuf.Cache(local), batch_size=8, seed=3)
    want = [next(want).tobytes() for _ in range(n)]
    shared = tmp_path / "shared"
    with pytest.warns(UserWarning, match="downloaded again and again"):
        small = tokshuf.Reader(tokshuf.Cache(url, cache_dir=shared, cache_limit=2 * size), batch_size=8, seed=3)
    big = tokshuf.Reader(tokshuf.Cache(url, cache_dir=shared), batch_size=8, seed=3)
    half = n // 2
    assert [next(small).tobytes() for _ in range(half)] == want[:half]
    # Where the small one is: its read-ahead is fetching the very shards the big one wants now.
    big.load_state_dict(small.state_dict())
    assert [next(big).tobytes() for _ in range(half, n)] == want[half:]


def test_remote_blocks_zst_cache_gives_the_local_batches(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    """Compressed blocks through a shard budget of two: evicted shards drop their decoded
    blocks too, and every batch stays the local one."""
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, format="blocks.zst", block_size=4, **OPTS)
    sizes = [p.stat().st_size for p in local.glob("shard_*.tar")]
    url = s3.url("caches/z")
    tokshuf._core._storage_publish(str(local), url)
    n = 2 * len(tokshuf.Cache(local)) // 8
    want = batches(tokshuf.Cache(local), n)
    proxy = s3.faults(seed=0, rate=0.0)
    with pytest.warns(UserWarning, match="downloaded again and again"):
        assert batches(tokshuf.Cache(url, cache_dir=tmp_path / "small", cache_limit=2 * max(sizes)), n) == want
    assert shard_gets(proxy) > len(sizes)


def test_remote_shard_altered_in_the_store_is_caught(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/s")
    tokshuf._core._storage_publish(str(local), url)
    data = bytearray((local / "shard_00000000.tar").read_bytes())
    data[700] ^= 0xFF  # same size, other bytes: only the sha256 tells
    s3.put("caches/s/shard_00000000.tar", bytes(data))
    cache = tokshuf.Cache(url, cache_dir=tmp_path / "cc")
    with pytest.raises(tokshuf.CacheCorruptError, match="sha256"):
        cache[0]
    assert not list((tmp_path / "cc").rglob("shard_00000000.tar*"))


def test_cli_build_and_read_take_urls(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    upload_all(s3, small_corpus, "corpus")
    tokshuf.build_cache(small_corpus, tmp_path / "local", **OPTS)

    def cli(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "tokshuf", *args], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        return run.stdout

    common = ["--seqlen", "64", "--chunk-size", "16", "--no-progress"]
    cli(
        "build",
        "--input",
        s3.url("corpus"),
        "--output",
        s3.url("caches/cli"),
        "--local-cell-dir",
        str(tmp_path / "s"),
        *common,
    )
    assert json.loads(s3.get("caches/cli/tokshuf.json"))["status"] == "complete"
    read = ["--batch-size", "8", "--steps", "5"]
    # The same batch checksums (the header names the cache; its fingerprint covers the input names).
    remote, local = (cli("read", c, *read).splitlines()[1:] for c in (s3.url("caches/cli"), str(tmp_path / "local")))
    assert remote == local and len(remote) == 6


def test_remote_reader_fetches_ahead_in_its_exact_future_order(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    size = max(p.stat().st_size for p in local.glob("shard_*.tar"))
    url = s3.url("caches/ahead")
    tokshuf._core._storage_publish(str(local), url)
    # Start in epoch 1, where chunks come in a reshuffled order, not manifest order.
    start = len(tokshuf.Cache(local)) + 5
    ref = tokshuf.Reader(tokshuf.Cache(local), batch_size=1, seed=3)
    ahead: List[int] = []
    for i in range(start, start + 4096):
        c = ref.locate(i)[1]
        if c not in ahead:
            ahead.append(c)
        if len(ahead) == 3:
            break
    assert ahead != sorted(ahead) or ahead[0] != 0
    d = tmp_path / "cc"
    with pytest.warns(UserWarning, match="downloaded again and again"):  # three shards: the point here
        r = tokshuf.Reader(tokshuf.Cache(url, cache_dir=d, cache_limit=3 * size), batch_size=1, seed=3, prefetch=0)
    r.seek(example=start)
    assert (
        next(r).tobytes()
        == tokshuf.Reader(tokshuf.Cache(local), batch_size=1, seed=3, start_step=start).__next__().tobytes()
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        have = sorted(p.name for p in d.rglob("shard_*"))
        if len(have) == 3 and not any(".part." in h for h in have):
            break
        time.sleep(0.05)
    # Exactly the next three shards of this reader's order are there: fetched ahead, in order.
    assert have == sorted(f"shard_{c:08d}.tar" for c in ahead)


# -- following a build into a store -----------------------------------------------------------


@pytest.mark.parametrize("shuffle", [True, False])
def test_follow_a_build_into_the_store(s3: S3, tmp_path: Path, small_corpus: list, shuffle: bool) -> None:
    """A reader opens the URL before the build has written anything, reads its first batch
    while the build still runs, and gets the local cache's batches."""
    args = step_args(small_corpus, s3.url("caches/follow"), local_cell_dir=str(tmp_path / "scratch"), shuffle=shuffle)
    local = tmp_path / "local"
    tokshuf.build_cache(
        small_corpus, local, seqlen=64, chunk_size=16, num_local_cells=3, shuffle=shuffle, progress=False
    )
    n = len(tokshuf.Cache(local)) // 8 + 3  # into the second epoch
    want = batches(tokshuf.Cache(local), n)
    done: Dict[str, float] = {}

    def build() -> None:
        drive(args, chunks_per_call=1, pause=0.3)
        done["at"] = time.monotonic()

    builder = threading.Thread(target=build)
    builder.start()
    try:
        cache = tokshuf.Cache(s3.url("caches/follow"), follow=True, timeout=60, cache_dir=tmp_path / "cc")
        r = tokshuf.Reader(cache, batch_size=8, seed=3, prefetch=0)
        got = [next(r).tobytes()]
        first_at = time.monotonic()
        got += [next(r).tobytes() for _ in range(n - 1)]
    finally:
        builder.join(timeout=120)
    assert got == want
    assert first_at < done["at"], "the reader did not follow: the build was over before its first batch"
    assert cache.following


DEAD_DRIVER = """
import json, sys, time
from tokshuf import _core
steps = _core.BuildSteps(**json.loads(sys.argv[1]))
assert steps.begin("{}") is None
steps.stage1(list(range(len(steps.input_sizes()))), 1)
steps.plan_chunks(1, "{}")
steps.add_lines(0, steps.stage2(0, 1, 1))
steps.upload_manifest(now=True)
print("listed", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["gave up", "killed"])
def test_follow_a_dead_build_in_the_store(
    s3: S3, tmp_path: Path, small_corpus: list, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A driver stops before the cache is complete, after listing its first chunk: giving up
    its lease (an error), or leaving it to go stale (SIGKILL; a lease of a second here). A
    reader waiting for a later chunk learns that the build is not running, instead of waiting
    forever."""
    monkeypatch.setenv("TOKSHUF_REMOTE_LEASE", "1")
    url = s3.url(f"caches/dead-{how.replace(' ', '-')}")
    args = step_args(small_corpus, url, local_cell_dir=str(tmp_path / "scratch"), shuffle=False)
    if how == "gave up":
        steps = _core.BuildSteps(**args)
        assert steps.begin("{}") is None
        # A second build refuses to start while the first one's lease is live.
        with pytest.raises(tokshuf.OutputExistsError, match="another tokshuf build"):
            _core.BuildSteps(**args).begin("{}")
        steps.stage1(list(range(len(steps.input_sizes()))), 1)
        steps.plan_chunks(1, "{}")
        steps.add_lines(0, steps.stage2(0, 1, 1))
        steps.upload_manifest(now=True)
        steps.release()
    else:
        cmd = [sys.executable, "-c", DEAD_DRIVER, json.dumps(args)]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as driver:
            try:
                assert driver.stdout is not None and driver.stdout.readline().strip() == "listed"
            finally:
                driver.kill()
    cache = tokshuf.Cache(url, follow=True, timeout=60, cache_dir=tmp_path / "cc")
    assert cache.following and cache.num_chunks > 1
    assert len(cache.get_batch(range(16))) == 16  # chunk 0 is there
    t = time.monotonic()
    with pytest.raises(tokshuf.BuildNotRunningError, match=r"s3://.*caches/dead.*not running"):
        cache.get_batch([len(cache) - 1])
    assert time.monotonic() - t < 30


# -- the command line on remote caches --------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tokshuf", *args], capture_output=True, text=True, timeout=300)


def test_cli_verify_status_inspect_blend_take_urls(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/cli2")
    _core._storage_publish(str(local), url)

    for args in (["verify", url], ["verify", url, "--full"]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
    status = json.loads(run_cli("status", url, "--json").stdout)
    meta = json.loads((local / "tokshuf.json").read_text())
    assert (status["status"], status["chunks_listed"], status["chunks_written"]) == (
        "complete",
        meta["num_chunks"],
        meta["num_chunks"],
    )
    remote, here = (run_cli("inspect", c, "-n", "3").stdout.splitlines() for c in (url, str(local)))
    assert remote[0] == url and remote[1:] == here[1:]
    blend = run_cli("blend", f"{url}:0.25", f"{local}:0.75", "--json")
    assert blend.returncode == 0, blend.stderr
    assert [round(c["achieved"], 3) for c in json.loads(blend.stdout)["components"]] == [0.25, 0.75]

    # A shard changed in the store: the same size is caught by --full; a cut one by any verify.
    shard = sorted(p.name for p in local.glob("shard_*.tar"))[1]
    data = bytearray((local / shard).read_bytes())
    data[700] ^= 0xFF
    s3.put(f"caches/cli2/{shard}", bytes(data))
    assert run_cli("verify", url).returncode == 0
    r = run_cli("verify", url, "--full")
    assert r.returncode == 1 and shard in r.stdout and "sha256" in r.stdout
    s3.put(f"caches/cli2/{shard}", bytes(data[:-1024]))
    r = run_cli("verify", url)
    assert r.returncode == 1 and shard in r.stdout


def test_status_of_a_build_into_the_store(
    s3: S3, tmp_path: Path, small_corpus: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKSHUF_REMOTE_LEASE", "1")
    url = s3.url("caches/st")
    steps = _core.BuildSteps(**step_args(small_corpus, url, local_cell_dir=str(tmp_path / "scratch")))
    assert steps.begin("{}") is None
    steps.stage1([0, 1], 1)
    s = build_status(url)
    assert (s["status"], s["stage"], s["files_done"], s["files_total"], s["running"]) == (
        "building",
        "tokenize",
        2,
        3,
        True,
    )
    assert s["work_dir"] == url + "/.tokshuf-work"
    steps.release()
    time.sleep(1.5)  # the lease goes stale
    assert build_status(url)["running"] is False
    r = run_cli("status", url)
    assert r.returncode == 0 and "not running" in r.stdout


def test_kept_shards_are_checked_and_missing_ones_are_a_corrupt_cache(
    s3: S3, tmp_path: Path, small_corpus: list
) -> None:
    """Shards a run left in cache_dir are hashed before a later run uses them; a shard the
    manifest lists but the store lacks is a CacheCorruptError, from the reader's own thread or
    from its read-ahead alike, naming the shard once."""
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/k")
    tokshuf._core._storage_publish(str(local), url)
    n = len(tokshuf.Cache(local)) // 8
    want = batches(tokshuf.Cache(local), n)
    kept = tmp_path / "kept"
    assert batches(tokshuf.Cache(url, cache_dir=kept), n) == want
    (shard,) = kept.rglob("shard_00000000.tar")
    data = bytearray(shard.read_bytes())
    data[700] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert batches(tokshuf.Cache(url, cache_dir=kept), n) == want  # fetched again, not served
    s3.client.delete_object(Bucket=s3.bucket, Key="caches/k/shard_00000001.tar")
    for prefetch in (0, 2):
        cache = tokshuf.Cache(url, cache_dir=tmp_path / f"cold{prefetch}")
        with pytest.raises(tokshuf.CacheCorruptError, match="no such object, though the manifest lists it") as e:
            for _ in tokshuf.Reader(cache, batch_size=8, prefetch=prefetch, single_pass=True):
                pass
        assert str(e.value).count("shard_00000001.tar") == 1, str(e.value)


def test_a_cache_limit_too_small_for_the_order_is_warned_of(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/w")
    tokshuf._core._storage_publish(str(local), url)
    size = max(p.stat().st_size for p in local.glob("shard_*.tar"))
    chunks = tokshuf.Cache(local).num_chunks
    assert chunks >= 4
    tight = tokshuf.Cache(url, cache_dir=tmp_path / "c", cache_limit=2 * size)
    with pytest.warns(UserWarning, match="downloaded again and again"):
        tokshuf.Reader(tight, batch_size=8)
    # A rank of world_size R* reads one stream: two shards are room enough; so is a single pass.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tokshuf.Reader(tight, batch_size=8, ideal_readers=4, world_size=4)
        tokshuf.Reader(tight, batch_size=8, single_pass=True)
        tokshuf.Reader(tokshuf.Cache(url, cache_dir=tmp_path / "c", cache_limit=chunks * size), batch_size=8)
    for bad in (-1, 2**64, "1G", 1.5, True):
        with pytest.raises(tokshuf.ConfigError, match="cache_limit"):
            tokshuf.Cache(url, cache_dir=tmp_path / "c", cache_limit=bad)


def test_an_input_object_changed_after_the_build_listed_it_stops_it(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    from support.build import BuildProcess

    upload_all(s3, small_corpus, "changing")
    inputs = [s3.url(f"changing/{p.name}") for p in small_corpus]
    out = tmp_path / "out"
    gate = tmp_path / "gate"
    b = BuildProcess(inputs, out, dict(OPTS, threads=1), {"TOKSHUF_TEST_GATE": f"start:{gate}"})
    b.wait_trace("gate start")
    first = small_corpus[0]
    s3.put(f"changing/{first.name}", first.read_bytes()[: first.stat().st_size // 2])
    gate.write_text("go")
    _, err = b.proc.communicate(timeout=120)
    assert b.proc.returncode != 0
    assert f"{first.name}: changed while the build ran" in err.decode(), err.decode()


def test_ctrl_c_is_not_held_by_a_hung_request(tmp_path: Path) -> None:
    """A store that accepts connections and never answers: Ctrl-C must stop the request in
    flight, not wait out its timeout and retries (minutes with the defaults used here)."""
    import os
    import signal
    import socket

    from support.s3 import TEST_ENV

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: List[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOKSHUF_"))}
    env.update({k: v for k, v in TEST_ENV.items() if k.startswith("AWS_")})
    env.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{server.getsockname()[1]}",
        AWS_ALLOW_HTTP="true",
        TOKSHUF_REMOTE_TIMEOUT="60",
        TOKSHUF_REMOTE_RETRIES="10",
    )
    code = f"import tokshuf; tokshuf.Cache('s3://hung/cache', cache_dir={str(tmp_path / 'cc')!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not accepted:  # the request is in flight
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert time.monotonic() - t0 < 10
        assert proc.returncode != 0 and b"KeyboardInterrupt" in err, err.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        server.close()
        for c in accepted:
            c.close()


def test_broken_remote_metadata_is_named_by_its_url(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    """A remote cache's metadata is read from a local copy; its errors name the object in the
    store, which the user knows, not the copy under cache_dir."""
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, **OPTS)
    url = s3.url("caches/m")
    tokshuf._core._storage_publish(str(local), url)
    manifest = (local / "manifest.jsonl").read_text().splitlines()
    meta = json.loads((local / "tokshuf.json").read_text())
    cases = {
        "manifest.jsonl": ("\n".join(manifest[:-1] + ["{not json"]) + "\n").encode(),
        "tokshuf.json": json.dumps({**meta, "num_contexts": meta["num_contexts"] + 1}).encode(),
    }
    for name, data in cases.items():
        s3.put(f"caches/m/{name}", data)
        with pytest.raises(tokshuf.CacheCorruptError) as e:
            tokshuf.Cache(url, cache_dir=tmp_path / "cc")
        assert f"{url}/" in str(e.value), str(e.value)
        assert str(tmp_path / "cc") not in str(e.value), str(e.value)
        s3.put(f"caches/m/{name}", (local / name).read_bytes())
    assert len(tokshuf.Cache(url, cache_dir=tmp_path / "cc")) == len(tokshuf.Cache(local))


def test_an_unpacked_cache_in_a_store_is_refused_by_name(s3: S3, tmp_path: Path, small_corpus: list) -> None:
    """The remote reader fetches one manifest; an unpacked cache has one per bin. Opening one,
    from Python or the command line, says so (it said manifest.jsonl was not found)."""
    local = tmp_path / "local"
    tokshuf.build_cache(small_corpus, local, seqlen=64, packing="none", bin_size=16, progress=False)
    files = [p for p in local.rglob("*") if p.is_file()]
    assert not (local / "manifest.jsonl").exists() and len(files) > 3
    for p in files:
        s3.put(f"caches/u/{p.relative_to(local)}", p.read_bytes())
    url = s3.url("caches/u")
    for follow in (False, True):
        with pytest.raises(tokshuf.ConfigError, match="unpacked"):
            tokshuf.Cache(url, cache_dir=tmp_path / "cc", follow=follow)
    for command in (["inspect", url, "-n", "1"], ["read", url, "--batch-size", "2", "--steps", "1"]):
        r = subprocess.run([sys.executable, "-m", "tokshuf", *command], capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "unpacked (packing='none') cache from a store is not supported" in r.stderr, r.stderr
