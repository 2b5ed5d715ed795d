"""Turning the ``inputs`` argument (files, directories, globs) into the sorted file list."""

from __future__ import annotations

import glob
import os
from typing import Iterable, List, Optional, Sequence, Union

from .exceptions import ConfigError, InputNotFoundError, TokshufIOError, TokshufPermissionError

PathLike = Union[str, "os.PathLike[str]"]
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd")
# Inputs of a shuffle-only build: tar shards of contexts.
SHARD_SUFFIXES = (".tar",)
URL_SCHEMES = ("s3://", "gs://", "az://")


def location(value: PathLike) -> str:
    """A path or URL as tokshuf takes it (docs/storage.md; the core's ``Location::parse``):
    s3://, gs:// and az:// URLs as they are, ``file://PATH`` as PATH, any other scheme an error
    (not a relative folder named ``gcs:``)."""
    from . import _core

    try:
        text = os.fsdecode(value)  # bytes too: a file name that is not UTF-8 stays exact
    except TypeError:
        raise ConfigError(f"a path must be a str, bytes or os.PathLike, not {type(value).__name__}") from None
    if not text:
        raise ConfigError('an empty path (name the folder: "." for this one)')
    return _core._storage_location(text)


def input_suffixes(ext: Optional[str], shuffle_only: bool) -> Sequence[str]:
    """The file names a directory is searched for: ``ext`` (``jsonl.zstd`` or ``.jsonl.zstd``,
    tokshuf-rs's ``--ext``) if given, else those of the input kind."""
    if ext:
        return ("." + ext.lstrip("."),)
    return SHARD_SUFFIXES if shuffle_only else SUFFIXES


def is_input_name(name: str, suffixes: Sequence[str] = SUFFIXES) -> bool:
    return name.endswith(tuple(suffixes))


def _unlistable(err: OSError) -> None:
    """os.walk skips a directory it cannot list; a build must not silently lose its files."""
    cls = TokshufPermissionError if isinstance(err, PermissionError) else TokshufIOError
    raise cls(f"{err.filename}: cannot list directory: {err.strerror}") from err


def _inside(path: str, folders: Sequence[str]) -> bool:
    """Is ``path`` (resolved) one of ``folders`` (real paths) or under one?"""
    return _under(os.path.realpath(path), folders)


def _under(real: str, folders: Sequence[str]) -> bool:
    return any(real == f or real.startswith(f.rstrip(os.sep) + os.sep) for f in folders)


def _shards(suffixes: Sequence[str]) -> bool:
    """Whether ``suffixes`` name shards (a shuffle-only build reads caches' shards)."""
    return tuple(suffixes) == SHARD_SUFFIXES


def _walk(root: str, suffixes: Sequence[str], exclude: Sequence[str]) -> Iterable[str]:
    """Files under ``root`` named with one of ``suffixes``, following symlinks but never entering
    a directory twice, nor one of ``exclude`` (real paths), nor, for text inputs, a cache
    folder below ``root`` (one holding a tokshuf.json)."""
    seen = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_unlistable):
        real = os.path.realpath(dirpath)
        if real in seen or _under(real, exclude):  # a symlink loop, a second link, the output
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames.sort()
        if dirpath != root and "tokshuf.json" in filenames and not _shards(suffixes):
            dirnames[:] = []  # a cache (another build's output): its manifests are not text
            continue
        for name in filenames:
            if is_input_name(name, suffixes):
                yield os.path.join(dirpath, name)


def expand_inputs(
    inputs: Union[PathLike, Iterable[PathLike]],
    suffixes: Sequence[str] = SUFFIXES,
    exclude: Sequence[PathLike] = (),
) -> List[str]:
    """Files, directories (recursive), globs and object-store URLs (``s3://BUCKET/PREFIX``,
    recursive, or with a glob on keys) -> sorted list of input files (full URLs for objects).
    Directories and prefixes are searched for names ending with one of ``suffixes``; a file
    named directly is taken whatever its name.

    A file reachable twice (given twice, through a directory and a symlink, or by a hard
    link) is read once. Folders in ``exclude`` (a build's output and work folders) are never
    searched, so a cache written inside an input directory is not read back as input; naming
    a path inside one is a ConfigError.
    """
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    skip = [os.path.realpath(os.fspath(f)) for f in exclude]
    found: List[str] = []
    for item in inputs:
        item = location(item)
        if not item.startswith(URL_SCHEMES) and _inside(item, skip):
            raise ConfigError(f"{item}: an input inside the build's output or work folder")
        if item.startswith(URL_SCHEMES):
            found.extend(_list_url(item, suffixes))
        elif os.path.isdir(item):
            files = list(_walk(item, suffixes, skip))
            if not files:
                raise InputNotFoundError(f"{item}: directory holds no {', '.join(suffixes)} files")
            found.extend(files)
        elif os.path.exists(item):
            found.append(item)
        elif glob.has_magic(item):
            matches = []
            for m in glob.glob(item, recursive=True):  # a folder matched is searched as one given
                if not _inside(m, skip):
                    matches.extend(_walk(m, suffixes, skip) if os.path.isdir(m) else [m])
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
        if not path.startswith(URL_SCHEMES) and not os.path.exists(
            path
        ):  # only links found in a directory walk get here
            raise InputNotFoundError(f"{path}: a symbolic link to nothing (dangling, or a loop)")
    unique: dict = {}
    for path in sorted(found):
        unique.setdefault(_identity(path), path)
    return sorted(unique.values())


def _list_url(url: str, suffixes: Sequence[str]) -> List[str]:
    """Input objects under a store prefix (recursively) or matching a glob on keys; a URL
    naming one object is taken whatever its name, like a local file."""
    from . import _core

    listed = [u for u, _ in _core._storage_list(url)]
    if listed == [url]:
        return listed
    # Caches below the prefix, as `_walk` skips them.
    caches = tuple(
        u[: -len("tokshuf.json")]
        for u in listed
        if u.endswith("/tokshuf.json") and not _shards(suffixes) and u != url.rstrip("/") + "/tokshuf.json"
    )
    inputs = [u for u in listed if is_input_name(u, suffixes) and not u.startswith(caches)]
    if not inputs:
        raise InputNotFoundError(f"{url}: no {', '.join(suffixes)} objects under this prefix or matching this pattern")
    return inputs


def _identity(path: str) -> object:
    """The file behind ``path``: the same for symlinks and hard links to one file."""
    if path.startswith(URL_SCHEMES):
        return path
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:  # dangling or looping link: kept, so the build names it in its error
        return os.path.realpath(path)
