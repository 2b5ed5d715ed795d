"""Type stubs of the compiled module ``tokshuf._core`` (checked by ``mypy.stubtest``)."""

import os
from typing import Any, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt
from typing_extensions import final

_StrPath = Union[str, "os.PathLike[str]"]

__version__: str
__all__ = [
    "BlendSchedule",
    "Cache",
    "Prefetcher",
    "ReaderCore",
    "Tokenizer",
    "__version__",
    "_fast_char_classes",
    "_fast_pretokenize",
    "_storage_delete",
    "_storage_get_range",
    "_storage_head",
    "_storage_list",
    "_storage_publish",
    "_storage_put",
    "_storage_read",
    "_tiktoken_data",
    "_tokenizer_json_path",
    "build_cache",
    "build_status",
    "parse_line",
]

def build_cache(**options: Any) -> str:
    """Build a cache from the keyword options of ``tokshuf.build_cache``; returns tokshuf.json."""

def build_status(output: _StrPath, local_cell_dir: Optional[_StrPath] = None) -> str: ...

@final
class Tokenizer:
    def __new__(cls, spec: str, allow_special_tokens: bool = False, backend: str = "auto") -> Tokenizer: ...
    @property
    def spec(self) -> str: ...
    @property
    def sha256(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def eot_id(self) -> Optional[int]: ...
    @property
    def pad_id(self) -> Optional[int]: ...
    @property
    def bos_id(self) -> Optional[int]: ...
    def encode(self, text: str) -> List[int]: ...
    def encode_batch(self, texts: List[str], threads: int = 0) -> List[List[int]]: ...
    def decode(self, ids: List[int]) -> str: ...

@final
class BlendSchedule:
    def __new__(cls, weights: List[float], quantum: int = ...) -> BlendSchedule: ...
    def __reduce__(self) -> Tuple[type, Tuple[List[float], int]]: ...
    @property
    def num_datasets(self) -> int: ...
    @property
    def quantum(self) -> int: ...
    @property
    def weights(self) -> List[float]: ...
    @property
    def quanta(self) -> List[int]: ...
    @property
    def raised(self) -> List[int]: ...
    @property
    def requested(self) -> List[float]: ...
    @property
    def achieved(self) -> List[float]: ...
    @property
    def max_lag(self) -> float: ...
    @property
    def max_lead(self) -> float: ...
    def period(self) -> Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]: ...
    def locate(self, m: int, sizes: Optional[List[int]] = None) -> Tuple[int, int]: ...
    def locate_many(
        self, ms: npt.NDArray[np.uint64], sizes: Optional[npt.NDArray[np.uint64]] = None
    ) -> Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint64]]: ...
    def position(self, k: int, e: int) -> int: ...
    def counts(self, m: int) -> List[int]: ...
    def cover_length(self, sizes: List[int]) -> int: ...
    def reader_core(
        self,
        caches: List[Cache],
        batch_size: int,
        rank: int,
        world_size: int,
        ideal_readers: int,
        seed: int,
        reshuffle: bool,
        single_pass: bool,
        drop_last: bool,
        dtype: str,
    ) -> ReaderCore: ...

@final
class Cache:
    def __new__(
        cls,
        path: _StrPath,
        check_files: bool = True,
        follow: bool = False,
        timeout: Optional[float] = None,
        cache_dir: Optional[_StrPath] = None,
        cache_limit: Optional[int] = None,
        downloads: int = 4,
    ) -> Cache: ...
    def prefetch_chunks(self, order: List[int]) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def following(self) -> bool: ...
    @property
    def recipe_fingerprint(self) -> str: ...
    @property
    def metadata_json(self) -> str: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def seqlen(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def chunk_size(self) -> int: ...
    @property
    def chunk_sizes(self) -> List[int]: ...
    @property
    def default_ideal_readers(self) -> int: ...
    def __len__(self) -> int: ...
    def get(self, indices: List[int], dtype: str) -> npt.NDArray[Any]: ...

@final
class ReaderCore:
    def __new__(
        cls,
        cache: Cache,
        batch_size: int,
        rank: int,
        world_size: int,
        ideal_readers: int,
        seed: int,
        reshuffle: bool,
        single_pass: bool,
        drop_last: bool,
        dtype: str,
    ) -> ReaderCore: ...
    def batch(self, first: int) -> npt.NDArray[Any]: ...
    def has_batch(self, first: int) -> bool: ...
    def locate(self, i: int) -> Tuple[int, int, int]: ...
    @property
    def end_pending(self) -> bool: ...
    @property
    def num_examples(self) -> Optional[int]: ...
    @property
    def end(self) -> Optional[int]: ...
    @property
    def seqlen(self) -> int: ...
    @property
    def source_description(self) -> str: ...
    def prefetch(self, first: int, threads: int, depth: int, every: int = 1) -> Prefetcher: ...

@final
class Prefetcher:
    def next(self) -> Optional[Tuple[int, npt.NDArray[Any]]]: ...

def parse_line(line: bytes, key: str = "text") -> Tuple[str, Optional[str]]: ...
def _fast_pretokenize(pattern: str, engine_name: str, text: str) -> Optional[List[str]]: ...
def _fast_char_classes() -> List[Tuple[str, List[int]]]: ...
def _tiktoken_data(name: str) -> bytes: ...
def _tokenizer_json_path(spec: str) -> str: ...

# Test-facing access to the storage layer (object stores and local paths); not public API.
def _storage_list(pattern: str) -> List[Tuple[str, int]]:
    """(URL or path, size) of every object under a prefix or matching a glob, sorted by key."""

def _storage_read(url: str, decompress: bool = False) -> bytes:
    """The whole object through the retrying streaming reader; ``decompress`` decodes
    ``.gz`` (every member) and ``.zst``/``.zstd`` (every frame)."""

def _storage_get_range(url: str, start: int, end: int) -> bytes:
    """Bytes ``start..end`` of an object."""

def _storage_put(path: str, url: str) -> None:
    """Upload a local file as one whole object (multipart above one part, completed or aborted)."""

def _storage_head(url: str) -> int:
    """Size of an object; ``InputNotFoundError`` when there is none."""

def _storage_delete(url: str) -> None:
    """Delete an object; one already gone is fine."""

def _storage_publish(local: str, url: str, overwrite: bool = False) -> Tuple[List[str], List[str]]:
    """Upload a complete local cache: shards, manifest, then tokshuf.json last; skips shards
    already there with the right size. Returns (uploaded, skipped) shard file names."""
