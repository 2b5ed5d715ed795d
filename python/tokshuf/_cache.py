"""``tokshuf.Cache``: open a finished cache, check it, and read its contexts by index."""

from __future__ import annotations

import json
import numbers
import operator
import os
from typing import Any, Dict, Iterable, List, Optional, Union

import numpy as np

from . import _core
from ._inputs import location
from .exceptions import ConfigError, TokshufError

PathLike = Union[str, "os.PathLike[str]"]

DTYPES = ("int32", "int64", "uint16", "uint32")


class Cache:
    """A tokshuf cache opened for reading.

    Opening reads ``tokshuf.json`` and ``manifest.jsonl`` and checks them against each other
    and against the folder's listing (names, counts; a missing shard raises
    :class:`tokshuf.CacheCorruptError` naming the file); a shard's size is checked when it is
    first read (a truncated one raises it then). No shard data is read until asked for;
    ``npy`` shards are memory-mapped, ``json.gz`` shards indexed by one scan of their headers.

    ``len(cache)`` is the number of contexts; ``cache[i]`` is context ``i`` in manifest order
    (a 1-D array of the cache's dtype), ``cache[i:j]`` and :meth:`get_batch` give 2-D arrays.

    Args:
        path: the cache folder, or an object-store URL (``s3://BUCKET/PREFIX``;
            docs/storage.md): whole shards are then downloaded into ``cache_dir`` before use,
            checked against the manifest, and the least recently used dropped to stay within
            ``cache_limit`` bytes; a second open finds them there (warm) and hashes each once
            before its first use.
        check_files: check at open that every shard exists, from one listing of the folder
            (default). ``False`` leaves that to each shard's first read too: for caches of
            very many chunks opened often. A remote cache's shards are checked as each is
            downloaded, not listed at open.
        follow: open a cache whose build is still running (docs/resume-and-follow.md): opening
            waits for ``tokshuf.json`` (and, for a shuffled build, for its chunk plan); ``len``,
            ``chunk_sizes`` and ``num_chunks`` wait for the plan; reads wait for their shards.
            On a complete cache it changes nothing.
        timeout: with ``follow``, seconds each wait may last (None: no limit) before
            :class:`tokshuf.FollowTimeoutError`; with no build running and the cache not
            complete, :class:`tokshuf.BuildNotRunningError` comes at once, except before any
            build has written ``tokshuf.json``: a timeout then waits for one to start.
        cache_dir: for a remote cache, the local folder of downloaded shards (default: a folder
            in the system's temporary folder).
        cache_limit: for a remote cache, the bytes ``cache_dir`` may hold (default: no limit).
    """

    def __init__(
        self,
        path: PathLike,
        *,
        check_files: bool = True,
        follow: bool = False,
        timeout: Optional[float] = None,
        cache_dir: Optional[PathLike] = None,
        cache_limit: Optional[int] = None,
    ) -> None:
        self._path = location(path)
        self._check_files = bool(check_files)
        self._follow = bool(follow)
        self._timeout = None if timeout is None else _seconds("timeout", timeout)
        self._cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        if cache_limit is not None and (
            isinstance(cache_limit, bool)
            or not isinstance(cache_limit, numbers.Integral)
            or not 0 <= cache_limit < 2**64
        ):
            raise ConfigError(f"cache_limit must be a number of bytes in [0, 2**64) or None, not {cache_limit!r}")
        self._cache_limit = None if cache_limit is None else int(cache_limit)
        self._inner = _core.Cache(
            self._path, self._check_files, self._follow, self._timeout, self._cache_dir, self._cache_limit
        )
        self._metadata: Dict[str, Any] = json.loads(self._inner.metadata_json)

    # Pickle by path: a DataLoader worker started with "spawn" reopens the cache.
    def __getstate__(self) -> Dict[str, Any]:
        return {
            "path": self._path,
            "check_files": self._check_files,
            "follow": self._follow,
            "timeout": self._timeout,
            "cache_dir": self._cache_dir,
            "cache_limit": self._cache_limit,
        }

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(
            state["path"],
            check_files=state.get("check_files", True),  # type: ignore[misc]
            follow=state.get("follow", False),
            timeout=state.get("timeout"),
            cache_dir=state.get("cache_dir"),
            cache_limit=state.get("cache_limit"),
        )

    @property
    def following(self) -> bool:
        """Opened with ``follow=True`` while the build was not complete."""
        return bool(self._inner.following)

    @property
    def recipe_fingerprint(self) -> str:
        """sha256 of the build recipe alone (known from the start of the build)."""
        return str(self._inner.recipe_fingerprint)

    def _state_fingerprints(self) -> List[str]:
        """Cache fingerprints a reader state may carry: states saved while following the
        build name its recipe (the manifest was not final yet), and once the followed build
        is complete, states saved by readers of the finished cache name its manifest too."""
        accepted = [self.fingerprint, self.recipe_fingerprint]
        if self.following:
            try:
                finished = Cache(
                    self._path, check_files=False, cache_dir=self._cache_dir, cache_limit=self._cache_limit
                )
            except TokshufError:
                pass  # not complete yet
            else:
                if finished.recipe_fingerprint == self.recipe_fingerprint:
                    accepted.append(finished.fingerprint)
        return accepted

    @property
    def path(self) -> str:
        return self._path

    @property
    def metadata(self) -> Dict[str, Any]:
        """The whole ``tokshuf.json``."""
        return self._metadata

    @property
    def seqlen(self) -> int:
        return int(self._inner.seqlen)

    @property
    def dtype(self) -> np.dtype:
        """dtype of the stored ids (uint16 or uint32)."""
        return np.dtype(self._inner.dtype)

    @property
    def format(self) -> str:
        return str(self._inner.format)

    @property
    def chunk_size(self) -> int:
        return int(self._inner.chunk_size)

    @property
    def block_size(self) -> int:
        """Contexts per tar member: 1, or ``block_size`` for the block formats."""
        return int(self._inner.block_size)

    @property
    def num_chunks(self) -> int:
        return len(self._inner.chunk_sizes)

    @property
    def chunk_sizes(self) -> List[int]:
        """Contexts per chunk, in manifest order."""
        return list(self._inner.chunk_sizes)

    @property
    def ideal_readers(self) -> int:
        """Default R*: tokshuf.json ``ideal_readers`` if set, else min(64, number of chunks)."""
        return int(self._inner.default_ideal_readers)

    @property
    def fingerprint(self) -> str:
        """sha256 of manifest.jsonl and the build recipe: names the cache's content
        (:attr:`recipe_fingerprint` for a cache opened while its build was running)."""
        return str(self._inner.fingerprint)

    @property
    def num_tokens(self) -> int:
        return int(self._metadata.get("num_tokens", 0))

    def __len__(self) -> int:
        return len(self._inner)

    def __repr__(self) -> str:
        if self.following:  # len() would wait for the plan
            return f"Cache({self._path!r}, following a build, seqlen={self.seqlen})"
        return f"Cache({self._path!r}, contexts={len(self)}, seqlen={self.seqlen}, chunks={self.num_chunks})"

    def _make_reader_core(
        self,
        batch_size: int,
        rank: int,
        world_size: int,
        ideal_readers: int,
        seed: int,
        reshuffle: bool,
        single_pass: bool,
        drop_last: bool,
        dtype: str,
    ) -> Any:
        """The Rust side of a :class:`tokshuf.Reader` over this cache (a Blend has the same)."""
        return _core.ReaderCore(
            self._inner, batch_size, rank, world_size, ideal_readers, seed, reshuffle, single_pass, drop_last, dtype
        )

    def get_batch(self, indices: Iterable[int], dtype: Union[str, np.dtype, None] = None) -> np.ndarray:
        """Contexts ``indices`` (manifest order, negative counts from the end) as a 2-D array of
        ``dtype`` (default: the cache's); ``ConfigError`` if it cannot hold the cache's ids."""
        n = len(self)
        idx = []
        for given in indices:
            try:
                i = operator.index(given)  # integers only, as for a list: not 1.5, not "7"
            except TypeError:
                raise TypeError(f"Cache indices must be integers, not {type(given).__name__}") from None
            if not -n <= i < n:
                raise IndexError(f"context {i} out of range (cache holds {n})")
            idx.append(i + n if i < 0 else i)
        return self._inner.get(idx, _dtype_name(dtype if dtype is not None else self.dtype))

    def __getitem__(self, key: Union[int, slice]) -> np.ndarray:
        if isinstance(key, slice):
            return self.get_batch(range(*key.indices(len(self))))
        try:
            i = operator.index(key)  # integers only: 1.5 is an error, as for a list
        except TypeError:
            raise TypeError(f"Cache indices must be integers or slices, not {type(key).__name__}") from None
        return self.get_batch([i])[0]


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number of seconds, not {value!r}")
    return float(value)


def _dtype_name(dtype: Union[str, np.dtype, type]) -> str:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise ConfigError(f"dtype={dtype!r}: expected one of {DTYPES}") from None
    name = dt.name
    if not dt.isnative:
        raise ConfigError(f"dtype={dtype!r}: batches are in the machine's byte order; ask for {name}")
    if name not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}: expected one of {DTYPES}")
    return name
