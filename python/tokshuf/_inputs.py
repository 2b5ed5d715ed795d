"""Turning the ``inputs`` argument (files, directories, globs) into the sorted file list."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Iterable, List, Union

from .exceptions import ConfigError, InputNotFoundError

PathLike = Union[str, "os.PathLike[str]"]
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd")


def is_input_name(name: str) -> bool:
    return name.endswith(SUFFIXES)


def _walk(root: str) -> Iterable[str]:
    """Files under ``root``, following symlinks but never entering a directory twice."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a symlink loop or a second link to the same directory
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        for name in filenames:
            if is_input_name(name):
                yield os.path.join(dirpath, name)


def expand_inputs(inputs: Union[PathLike, Iterable[PathLike]]) -> List[str]:
    """Files, directories (recursive) and globs -> sorted list of input files.

    A file reachable twice (given twice, or through a directory and a symlink) is read once.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    found: List[str] = []
    for item in inputs:
        item = os.fspath(item)
        if os.path.isdir(item):
            files = list(_walk(item))
            if not files:
                raise InputNotFoundError(f"{item}: directory holds no {', '.join(SUFFIXES)} files")
            found.extend(files)
        elif os.path.exists(item):
            found.append(item)
        elif glob.has_magic(item):
            matches = [m for m in glob.glob(item, recursive=True) if os.path.isfile(m)]
            if not matches:
                raise InputNotFoundError(f"{item}: pattern matches no files")
            found.extend(matches)
        else:
            raise InputNotFoundError(f"{item}: no such file or directory")
    if not found:
        raise ConfigError("no input files given")
    unique = {}
    for path in sorted(found):
        unique.setdefault(os.path.realpath(path), path)
    return sorted(unique.values())


def resolve_output(output: PathLike) -> Path:
    return Path(os.fspath(output))
