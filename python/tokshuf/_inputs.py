"""Turning the ``inputs`` argument (files, directories, globs) into the sorted file list."""

from __future__ import annotations

import glob
import os
from typing import Iterable, List, Union

from .exceptions import ConfigError, InputNotFoundError, TokshufIOError, TokshufPermissionError

PathLike = Union[str, "os.PathLike[str]"]
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd")


def is_input_name(name: str) -> bool:
    return name.endswith(SUFFIXES)


def _unlistable(err: OSError) -> None:
    """os.walk skips a directory it cannot list; a build must not silently lose its files."""
    cls = TokshufPermissionError if isinstance(err, PermissionError) else TokshufIOError
    raise cls(f"{err.filename}: cannot list directory: {err.strerror}") from err


def _walk(root: str) -> Iterable[str]:
    """Files under ``root``, following symlinks but never entering a directory twice."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_unlistable):
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

    A file reachable twice (given twice, through a directory and a symlink, or by a hard
    link) is read once.
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
        elif os.path.lexists(item):
            raise InputNotFoundError(f"{item}: a symbolic link to nothing (dangling, or a loop)")
        else:
            raise InputNotFoundError(f"{item}: no such file or directory")
    if not found:
        raise ConfigError("no input files given")
    for path in sorted(found):
        if not os.path.exists(path):  # only links found in a directory walk get here
            raise InputNotFoundError(f"{path}: a symbolic link to nothing (dangling, or a loop)")
    unique: dict = {}
    for path in sorted(found):
        unique.setdefault(_identity(path), path)
    return sorted(unique.values())


def _identity(path: str) -> object:
    """The file behind ``path``: the same for symlinks and hard links to one file."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:  # dangling or looping link: kept, so the build names it in its error
        return os.path.realpath(path)
