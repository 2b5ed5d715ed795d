"""Hypothesis profiles and the fixtures shared by several test modules (helpers live in
``support/``)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
from hypothesis import HealthCheck, settings
from support.corpus import three_files
from support.s3 import S3, bucket, moto_server

# The tokenizer tables the fast backend saves go to a folder of this session, not ~/.cache.
os.environ["TOKSHUF_TOKENIZER_CACHE"] = tempfile.mkdtemp(prefix="tokshuf-tables-")
atexit.register(shutil.rmtree, os.environ["TOKSHUF_TOKENIZER_CACHE"], ignore_errors=True)

# Small by default so CI stays fast; HYPOTHESIS_PROFILE=dev for a longer local run.
settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def small_corpus(tmp_path: Path) -> List[Path]:
    """Three small input files (plain, gzip, zstd) with known documents."""
    return three_files(tmp_path / "in")


@pytest.fixture(scope="session", name="moto_server")
def moto_server_fixture() -> Iterator[Tuple[str, int]]:
    """moto's standalone S3 server on 127.0.0.1, for the whole session."""
    pytest.importorskip("moto.server", reason="needs moto[server] (the test extra)")
    with moto_server() as addr:
        yield addr


@pytest.fixture
def s3(moto_server: Tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    """A fresh bucket, the AWS environment for it, and the fault proxy tokshuf talks through."""
    pytest.importorskip("boto3")
    with bucket(moto_server, monkeypatch) as b:
        yield b
