"""Builds whose output is an object-store URL (``s3://``, ``gs://``, ``az://``).

The cache is built on local disk first, in a staging folder under ``local_cell_dir`` (or the
system's temporary folder), with the builder's usual resume rules; it is then published: shards
as whole objects, manifest.jsonl, and tokshuf.json with status ``complete`` last. Running the
same call again after a failure resumes the local build and uploads only the shards not yet in
the store. The staging folder is removed once the cache is published.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from . import _core
from .exceptions import ConfigError

SCHEMES = ("s3://", "gs://", "az://")


def is_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(SCHEMES)


def staging_dir(url: str, local_cell_dir: Optional[str]) -> Path:
    """Where the cache for ``url`` is built before it is uploaded: one folder per URL, so a
    second run finds the first one's work."""
    base = Path(local_cell_dir) if local_cell_dir is not None else Path(tempfile.gettempdir())
    return base / f"tokshuf-staging-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def build_to_url(
    build: Any, inputs: Any, url: str, local_cell_dir: Optional[str], overwrite: bool, **options: Any
) -> Any:
    """``build_cache`` for a URL output; ``build`` is ``build_cache`` itself (local output)."""
    url = url.rstrip("/")
    if options.get("packing") == "none":
        raise ConfigError(
            f"{url}: an unpacked (packing='none') cache cannot be built into an object store yet; build it locally"
        )
    _core._storage_check_output(url)  # a wrong prefix, bucket or credentials show before the build
    stage = staging_dir(url, local_cell_dir)
    stats = build(inputs, stage, local_cell_dir=local_cell_dir, overwrite=overwrite, **options)
    _core._storage_publish(os.fspath(stage), url, overwrite)
    shutil.rmtree(stage, ignore_errors=True)
    return dataclasses.replace(stats, output=url)
