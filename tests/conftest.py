"""Shared test set-up: hypothesis profiles, paths, and a small corpus writer."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterable, List

import pytest
from hypothesis import HealthCheck, settings

# Small by default so CI stays fast; HYPOTHESIS_PROFILE=dev for a longer local run.
settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TESTS = Path(__file__).parent
DATA = TESTS / "data"


def write_jsonl(path: Path, docs: Iterable[str], key: str = "text") -> Path:
    """Write documents as jsonl (gzip or zstd by suffix)."""
    payload = "".join(json.dumps({key: d}) + "\n" for d in docs).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        payload = gzip.compress(payload, mtime=0)
    elif path.name.endswith((".zst", ".zstd")):
        import zstandard

        payload = zstandard.ZstdCompressor().compress(payload)
    path.write_bytes(payload)
    return path


def make_docs(n: int, seed: int = 0) -> List[str]:
    """Deterministic documents of varied length (some shorter, some longer than a context)."""
    import random

    rng = random.Random(seed)
    words = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he", "this", "are", "or", "his"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 400))) + "." for _ in range(n)]


@pytest.fixture
def small_corpus(tmp_path: Path) -> List[Path]:
    """Three small input files (plain, gzip, zstd) with known documents."""
    return [
        write_jsonl(tmp_path / "in" / "a.jsonl", make_docs(40, 1)),
        write_jsonl(tmp_path / "in" / "b.jsonl.gz", make_docs(25, 2)),
        write_jsonl(tmp_path / "in" / "c.jsonl.zst", make_docs(30, 3)),
    ]
