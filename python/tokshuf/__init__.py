"""tokshuf: jsonl corpora -> tokenized, shuffled WebDataset caches, read back deterministically."""

from __future__ import annotations

from ._build import DEFAULT_TOKENIZER, BuildStats, build_cache
from ._core import Tokenizer, __version__
from ._verify import VerifyReport, verify
from .exceptions import (
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
    "BuildStats",
    "DEFAULT_TOKENIZER",
    "Tokenizer",
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
]
