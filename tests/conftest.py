"""Hypothesis profiles and the fixtures shared by several test modules (helpers live in
``support/``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest
from hypothesis import HealthCheck, settings
from support.corpus import three_files

# Small by default so CI stays fast; HYPOTHESIS_PROFILE=dev for a longer local run.
settings.register_profile("ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def small_corpus(tmp_path: Path) -> List[Path]:
    """Three small input files (plain, gzip, zstd) with known documents."""
    return three_files(tmp_path / "in")
