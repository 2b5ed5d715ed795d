"""``tokshuf.UnpackedCache``: a cache built with ``packing="none"`` (docs/format.md §4.2), and
the batches a :class:`tokshuf.Reader` reads from it."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, NamedTuple

import numpy as np

from . import _core
from ._cache import PathLike


def _index(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    if not 0 <= value < 2**63:
        raise IndexError(f"{name} {value} out of range")
    return int(value)


class UnpackedBatch(NamedTuple):
    """One rank's slice of a global batch of an unpacked cache.

    ``tokens``: ``(rows, width)`` ids, each row an example padded with the cache's ``pad_id``
    after its ``lengths[row]`` ids; ``width`` is the longest example of the global batch (or the
    bin's bound with ``pad_to="bin"``), the same on every rank. ``attention_mask``: ``(rows,
    width)`` bool, True on real ids. ``bin``: the length bin the batch came from.
    ``num_tokens``: real ids of the whole global batch (all ranks).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    attention_mask: np.ndarray
    bin: int
    num_tokens: int


def make_batch(raw: Any) -> UnpackedBatch:
    """An :class:`UnpackedBatch` from the core's ``(ids, lengths, mask, bin, global_tokens)``."""
    ids, lengths, mask, k, tokens = raw
    return UnpackedBatch(ids, lengths, mask, int(k), int(tokens))


def is_unpacked(path: PathLike) -> bool:
    """Whether the local cache folder ``path`` holds an unpacked cache (its tokshuf.json says
    ``"packing": "none"``). False when there is no readable tokshuf.json: opening the cache
    then reports what is wrong."""
    try:
        with open(os.path.join(os.fspath(path), "tokshuf.json"), "rb") as f:
            meta = json.load(f)
    except (OSError, ValueError, TypeError):
        return False
    return isinstance(meta, dict) and meta.get("packing") == "none"


class UnpackedCache:
    """A cache of unpacked documents in length bins (``packing="none"``), opened and checked:
    tokshuf.json, every bin's manifest, every shard present and every ``.idx`` sidecar's size
    (a shard's own size is checked when it is first read).

    Read it with :class:`tokshuf.Reader`, which draws every global batch from one bin. Bin
    ``k`` is the sub-cache ``bin_KK/``; ``bins`` lists each bin's bound and counts.
    """

    def __init__(self, path: PathLike, *, check_files: bool = True) -> None:
        self._path = os.fspath(path)
        self._check_files = bool(check_files)
        self._inner = _core.UnpackedCache(self._path, self._check_files)
        self._metadata: Dict[str, Any] = json.loads(self._inner.metadata_json)

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self._path, "check_files": self._check_files}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["path"], check_files=state.get("check_files", True))  # type: ignore[misc]

    @property
    def path(self) -> str:
        return self._path

    @property
    def metadata(self) -> Dict[str, Any]:
        """The whole ``tokshuf.json``."""
        return self._metadata

    @property
    def seqlen(self) -> int:
        """The longest an example can be (the last bin's bound)."""
        return int(self._inner.seqlen)

    @property
    def bins(self) -> List[Dict[str, int]]:
        """Per bin: ``max_len``, ``num_examples``, ``num_tokens``, ``num_chunks``."""
        return [dict(b) for b in self._metadata["bins"]]

    @property
    def chunk_sizes(self) -> List[List[int]]:
        """Examples per chunk of each bin, in manifest order."""
        return [list(s) for s in self._inner.chunk_sizes]

    @property
    def ideal_readers(self) -> int:
        """Default R*: tokshuf.json ``ideal_readers`` if set, else min(64, chunks of the largest bin)."""
        return int(self._inner.default_ideal_readers)

    @property
    def fingerprint(self) -> str:
        """sha256 of every bin's manifest and the build recipe."""
        return str(self._inner.fingerprint)

    @property
    def num_tokens(self) -> int:
        return int(self._metadata.get("num_tokens", 0))

    def __len__(self) -> int:
        return sum(b["num_examples"] for b in self.bins)

    def lengths(self, bin: int) -> np.ndarray:
        """Lengths of bin ``bin``'s examples in manifest order (reads every member header)."""
        return self._inner.lengths(_index("bin", bin))

    def example(self, bin: int, chunk: int, index: int) -> np.ndarray:
        """Example ``index`` of chunk ``chunk`` of bin ``bin``, as a 1-D int64 array."""
        return self._inner.example(_index("bin", bin), _index("chunk", chunk), _index("index", index))

    def __repr__(self) -> str:
        return f"UnpackedCache({self._path!r}, examples={len(self)}, bins={len(self.bins)}, seqlen={self.seqlen})"

    def _make_unpacked_core(
        self,
        batch_size: int,
        rank: int,
        world_size: int,
        ideal_readers: int,
        seed: int,
        reshuffle: bool,
        dtype: str,
        pad_to: str,
    ) -> Any:
        return _core.UnpackedReaderCore(
            self._inner, batch_size, rank, world_size, ideal_readers, seed, reshuffle, dtype, pad_to
        )
