"""tokshuf: jsonl corpora -> tokenized, shuffled WebDataset caches, read back deterministically."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._build import DEFAULT_TOKENIZER, BuildStats, build_cache
from ._core import Tokenizer, __version__
from .exceptions import (
    BuildNotRunningError,
    CacheCorruptError,
    ClusterError,
    ConfigError,
    DiskFullError,
    FollowTimeoutError,
    InputError,
    InputNotFoundError,
    OutputExistsError,
    RemoteError,
    StateMismatchError,
    TokenizerError,
    TokshufError,
    TokshufIOError,
    TokshufPermissionError,
)

# The reading side needs NumPy; importing it starts OpenBLAS's thread pool, whose threads spin
# for a while and take cores from a build. So `import tokshuf` and builds never load NumPy:
# these names are imported on first use.
_LAZY = {
    "Blend": "._blend",
    "Cache": "._cache",
    "Reader": "._reader",
    "document_boundaries": "._boundaries",
    "shift_targets": "._reader",
    "UnpackedBatch": "._unpacked",
    "UnpackedCache": "._unpacked",
    "verify": "._verify",
    "VerifyReport": "._verify",
}

if TYPE_CHECKING:
    from ._blend import Blend
    from ._boundaries import document_boundaries
    from ._cache import Cache
    from ._reader import Reader, shift_targets
    from ._unpacked import UnpackedBatch, UnpackedCache
    from ._verify import VerifyReport, verify


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tokshuf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "DEFAULT_TOKENIZER",
    "Blend",
    "BuildNotRunningError",
    "BuildStats",
    "Cache",
    "CacheCorruptError",
    "ClusterError",
    "ConfigError",
    "DiskFullError",
    "FollowTimeoutError",
    "InputError",
    "InputNotFoundError",
    "OutputExistsError",
    "Reader",
    "RemoteError",
    "StateMismatchError",
    "Tokenizer",
    "TokenizerError",
    "TokshufError",
    "TokshufIOError",
    "TokshufPermissionError",
    "UnpackedBatch",
    "UnpackedCache",
    "VerifyReport",
    "__version__",
    "build_cache",
    "document_boundaries",
    "shift_targets",
    "verify",
]
