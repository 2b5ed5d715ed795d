"""Every expected failure of tokshuf is one of these, all under :class:`TokshufError`.

They also subclass the built-in exception a caller would naturally catch (``ValueError`` for bad
values and data, ``OSError`` and friends for the file system), so generic handlers keep working.
"""

from __future__ import annotations


class TokshufError(Exception):
    """Base class of all tokshuf errors."""


class ConfigError(TokshufError, ValueError):
    """Options that are invalid or do not fit together."""


class InputError(TokshufError, ValueError):
    """An input line or stream that cannot be used; the message names file, line and reason."""


class InputNotFoundError(TokshufError, FileNotFoundError):
    """An input path (or a match for a directory or glob) that does not exist."""


class TokshufIOError(TokshufError, OSError):
    """The operating system refused a read or write (permissions, I/O error...)."""


class TokshufPermissionError(TokshufIOError, PermissionError):
    """The operating system denied access to an input or output path."""


class DiskFullError(TokshufIOError):
    """No space left on a device. Free space and run the same build again to resume."""


class RemoteError(TokshufIOError):
    """An object store kept failing (retries spent) or refused a request; the message names
    the URL. Credentials never appear in it."""


class TokenizerError(TokshufError, ValueError):
    """The tokenizer cannot be found, loaded or used as asked."""


class CacheCorruptError(TokshufError, ValueError):
    """A cache on disk does not match its metadata (missing, truncated or altered files)."""


class OutputExistsError(TokshufError, FileExistsError):
    """The output folder holds something a build must not overwrite or resume."""


class StateMismatchError(TokshufError, ValueError):
    """A reader state from another cache or other order options."""


class BuildNotRunningError(TokshufError, RuntimeError):
    """Follow mode: the cache is not complete and no build is running; resume the build by
    running the same build command again."""


class ClusterError(TokshufError, RuntimeError):
    """``engine="ray"``: the cluster kept failing a task (its worker crashed, was killed for
    memory, or its node died) after every retry; what was done is kept, so running the same
    build again resumes it."""


class FollowTimeoutError(TokshufError, TimeoutError):
    """Follow mode: what the reader waits for (the chunk plan, a shard, manifest lines) did not
    appear within ``timeout`` seconds, though a build is running."""


__all__ = [
    "BuildNotRunningError",
    "CacheCorruptError",
    "ClusterError",
    "ConfigError",
    "DiskFullError",
    "FollowTimeoutError",
    "InputError",
    "InputNotFoundError",
    "OutputExistsError",
    "RemoteError",
    "StateMismatchError",
    "TokenizerError",
    "TokshufError",
    "TokshufIOError",
    "TokshufPermissionError",
]
