"""tokshuf: jsonl corpora -> tokenized, shuffled WebDataset caches, read back deterministically."""

from __future__ import annotations

from ._blend import Blend
from ._build import DEFAULT_TOKENIZER, BuildStats, build_cache
from ._cache import Cache
from ._core import Tokenizer, __version__
from ._reader import Reader, shift_targets
from ._verify import VerifyReport, verify
from .exceptions import (
    BuildNotRunningError,
    FollowTimeoutError,
    CacheCorruptError,
    ConfigError,
    DiskFullError,
    InputError,
    InputNotFoundError,
    OutputExistsError,
    StateMismatchError,
    TokenizerError,
    TokshufError,
    TokshufIOError,
    TokshufPermissionError,
)

__all__ = [
    "__version__",
    "build_cache",
    "Blend",
    "BuildStats",
    "DEFAULT_TOKENIZER",
    "Tokenizer",
    "Cache",
    "Reader",
    "shift_targets",
    "verify",
    "VerifyReport",
    "TokshufError",
    "ConfigError",
    "InputError",
    "InputNotFoundError",
    "TokshufIOError",
    "TokshufPermissionError",
    "DiskFullError",
    "TokenizerError",
    "CacheCorruptError",
    "OutputExistsError",
    "StateMismatchError",
    "BuildNotRunningError",
    "FollowTimeoutError",
]
