"""``tokshuf.Reader``: one rank's batches of the global example order (docs/format.md §6)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from typing import Any, Dict, Iterator, Literal, Optional, Tuple, Union

import numpy as np

from . import _core
from ._blend import Blend
from ._boundaries import LAYOUTS, Boundaries, document_boundaries
from ._cache import Cache, PathLike, _dtype_name
from ._remote import is_url
from ._unpacked import UnpackedCache, is_unpacked, make_batch
from .exceptions import ConfigError, StateMismatchError

STATE_VERSION = 1

_MAX_EXAMPLE = _core._MAX_EXAMPLE  # 2**62


def shift_targets(batch: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Split contexts for next-token training.

    Args:
        batch: ``(B, seqlen)`` ids.

    Returns:
        ``(inputs, targets)``: ``batch[:, :-1]`` and ``batch[:, 1:]`` (views, no copy).
    """
    if isinstance(batch, tuple) or getattr(batch, "ndim", None) != 2:
        raise ConfigError(
            f"shift_targets takes a (B, seqlen) array or tensor, not {type(batch).__name__}: shift an UnpackedBatch's "
            "tokens (and mask past each row's length), or a (batch, boundaries) pair's batch, yourself"
        )
    return batch[:, :-1], batch[:, 1:]


def _int(name: str, value: Any, lo: int = 0) -> int:
    # Every count and index goes to the core as a u64.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value < 2**64:
        raise ConfigError(f"{name} must be an integer in [{lo}, 2**64), not {value!r}")
    return int(value)


def _warn_if_shards_thrash(cache: Cache, ideal_readers: int, world_size: int) -> None:
    """A remote cache whose ``cache_limit`` cannot hold the shards a rank reads side by side.

    The order interleaves R* streams, each reading its own chunk, and a rank's examples fall in
    R* / gcd(world_size, R*) of them: with fewer shards than that in the local cache, nearly
    every example evicts a shard another needs next and downloads one again."""
    limit = cache._cache_limit
    meta = cache.metadata
    if limit is None or not is_url(cache.path) or meta.get("status") != "complete":
        return  # no budget, or a local cache (read where it is)
    contexts, chunks, size = meta.get("num_contexts") or 0, meta.get("num_chunks") or 0, meta.get("bytes_out") or 0
    if not (contexts and chunks and size):
        return
    side_by_side = min(ideal_readers // math.gcd(world_size, ideal_readers), chunks)
    shard = size * min(meta.get("chunk_size") or contexts, contexts) // contexts  # a full chunk's shard
    if limit < side_by_side * shard:
        warnings.warn(
            f"{cache.path}: cache_limit={limit} holds fewer than the {side_by_side} shards of about {shard} bytes "
            f"this reader reads side by side (ideal_readers={ideal_readers}, world_size={world_size}), so shards "
            f"would be downloaded again and again: give cache_limit at least {side_by_side * shard}",
            stacklevel=3,
        )


class Reader:
    """Deterministic batches of a cache or a :class:`tokshuf.Blend` for rank ``rank`` of
    ``world_size``.

    Global batch ``b`` holds examples ``[b*B, (b+1)*B)`` of the order of docs/format.md §6 (B =
    ``batch_size``); this rank gets every ``world_size``-th of them starting at ``rank``, as an
    array of shape ``(batch_size // world_size, seqlen)``. The global batches are the same for
    every ``world_size``. Iterating never ends unless ``single_pass=True``. For a blend,
    blended example ``m`` (docs/format.md §7) takes the place of ``example[m]``: everything below,
    seek and state included, works the same.

    An unpacked cache (``packing="none"``, :class:`tokshuf.UnpackedCache`) yields
    :class:`tokshuf.UnpackedBatch` tuples ``(tokens, lengths, attention_mask, bin, num_tokens)``:
    every global batch comes from one length bin, bins drawn in proportion to their example
    counts by the blend schedule (docs/format.md §4.2); ``tokens`` is padded to the longest
    example of the global batch (``pad_to="longest"``, the same width on every rank) or to the
    bin's bound (``pad_to="bin"``). Reading and seeking go by whole batches (an example index
    must be a multiple of ``batch_size``); ``tokens_seen`` counts the real ids of the global
    batches read, and is saved in :meth:`state_dict` (restored by :meth:`load_state_dict`). ``single_pass``,
    ``boundaries``, ``follow`` and blends do not apply to unpacked caches.

    Args:
        cache: a :class:`tokshuf.Cache`, a cache path (local or an object-store URL), a
            :class:`tokshuf.Blend`, or an unpacked cache (:class:`tokshuf.UnpackedCache`).
        batch_size: the global batch size ``B``, divisible by ``world_size``.
        rank: this reader's rank, ``0 <= rank < world_size``.
        world_size: the number of ranks reading the global batches.
        ideal_readers: R*, which fixes the order: keep it when the number of GPUs changes.
            Default: the cache's ``ideal_readers`` key if present, else min(64, number of
            chunks); for a blend, the smallest of its caches' defaults (the same R* orders every
            component).
        seed: the seed of the chunk and context permutations of epochs >= 1 (default 0). A
            blend carries its own seed: leave ``seed`` out (or give the same value).
        single_pass: read every context once, in manifest order, then stop (evaluation). A
            single pass over a blend lasts until every example of every cache was read once;
            smaller caches wrap around meanwhile (:meth:`tokshuf.Blend.single_pass_length`).
        reshuffle: permute chunks and contexts in epochs >= 1 (default), or repeat epoch 0.
        drop_last: in a single pass, drop a last batch shorter than ``batch_size``.
        start_step: the first global batch to read (as :meth:`seek` with ``step``).
        prefetch: batches read ahead on background threads (0: read on demand). The threads
            start on the first batch, never at construction, and restart after a fork.
        threads: read-ahead threads, at most 4096 (default: min(4, prefetch, cores)).
        dtype: the dtype of the batches.
        follow: read a cache while its build runs (see :class:`tokshuf.Cache`): the batches are
            exactly those of the finished cache, each waiting until the shards (and, for a
            ``shuffle=False`` build, the manifest lines or the plan) it needs exist. While the
            end of a single pass is not known, ``num_examples`` and ``num_steps`` are None.
            States saved while following load on the finished cache. A :class:`tokshuf.Cache`
            given as ``cache`` follows as it was opened: ``follow`` and ``timeout`` other than
            its own raise :class:`tokshuf.ConfigError`.
        timeout: with ``follow``, seconds to wait for each missing piece (None: no limit)
            before :class:`tokshuf.FollowTimeoutError`; also how long to wait for a build that
            has not written ``tokshuf.json`` yet to start.
        boundaries: ``"segment_ids"``, ``"position_ids"`` or ``"cu_seqlens"`` makes every batch
            a pair ``(batch, boundaries)``: where each document starts in each context,
            computed from the EOT ids (see :func:`tokshuf.document_boundaries`), for attention
            masks that keep packed documents apart.
        pad_to: for an unpacked cache, ``"longest"`` (default: the longest example of the
            global batch) or ``"bin"`` (the bin's bound).
    """

    def __init__(
        self,
        cache: Union[Cache, PathLike, Any],
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        ideal_readers: Optional[int] = None,
        seed: Optional[int] = None,
        single_pass: bool = False,
        reshuffle: bool = True,
        drop_last: bool = False,
        start_step: int = 0,
        prefetch: int = 4,
        threads: Optional[int] = None,
        dtype: Union[Literal["int32", "int64", "uint16", "uint32"], np.dtype, type] = "int32",
        follow: bool = False,
        timeout: Optional[float] = None,
        boundaries: Optional[Literal["segment_ids", "position_ids", "cu_seqlens"]] = None,
        pad_to: Optional[Literal["longest", "bin"]] = None,
    ) -> None:
        if boundaries is not None and boundaries not in LAYOUTS:
            raise ConfigError(f"boundaries={boundaries!r}: expected one of {', '.join(LAYOUTS)} or None")
        self._boundaries = boundaries
        self._batch_size = _int("batch_size", batch_size, 1)
        self._world_size = _int("world_size", world_size, 1)
        self._rank = _int("rank", rank, 0)
        if self._rank >= self._world_size:
            raise ConfigError(f"rank {rank} must be < world_size {world_size}")
        if self._batch_size % self._world_size:
            raise ConfigError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
        self._single_pass = bool(single_pass)
        self._reshuffle = bool(reshuffle)
        self._drop_last = bool(drop_last)
        self._prefetch = _int("prefetch", prefetch, 0)
        cpus = os.cpu_count() or 1
        self._threads = _int("threads", threads, 1) if threads is not None else max(1, min(4, self._prefetch, cpus))
        self._dtype = _dtype_name(dtype)
        if follow and isinstance(cache, Blend):
            raise ConfigError("follow=True reads one cache while it is built, not a blend")
        if isinstance(cache, (Cache, Blend, UnpackedCache)):
            # Following is decided when a cache is opened: an opened one keeps its own way, and
            # options that say otherwise are refused rather than dropped.
            opened_follow = cache._follow if isinstance(cache, Cache) else False
            opened_timeout = cache._timeout if isinstance(cache, Cache) else None
            if (follow and not opened_follow) or (timeout is not None and timeout != opened_timeout):
                raise ConfigError(
                    f"follow={follow!r}, timeout={timeout!r}: {cache!r} was opened with follow={opened_follow!r}, "
                    f"timeout={opened_timeout!r}; give these to Cache(path, follow=..., timeout=...), or pass the Reader a path"
                )
            self._source = cache
        elif is_unpacked(cache):
            if follow:
                raise ConfigError("follow=True does not read unpacked (packing='none') caches: wait for the build")
            self._source = UnpackedCache(cache)
        else:
            self._source = Cache(cache, follow=bool(follow), timeout=timeout)
        self._unpacked = isinstance(self._source, UnpackedCache)
        self._tokens_seen = 0
        if self._unpacked:
            for name, given in (("single_pass", self._single_pass), ("boundaries", boundaries is not None)):
                if given:
                    raise ConfigError(f"{name} does not apply to an unpacked (packing='none') cache")
            if pad_to is None:
                pad_to = "longest"
            if pad_to not in ("longest", "bin"):
                raise ConfigError(f"pad_to={pad_to!r}: expected 'longest' or 'bin'")
        elif pad_to is not None:
            raise ConfigError("pad_to is an option of unpacked (packing='none') caches")
        self._pad_to = pad_to
        if isinstance(self._source, Blend):
            if seed is not None and seed != self._source.seed:
                raise ConfigError(
                    f"seed={seed!r} differs from the blend's seed {self._source.seed}: "
                    "a blend fixes the seed of its components' order (Blend(..., seed=...))"
                )
            seed = self._source.seed
        self._seed = _int("seed", 0 if seed is None else seed, 0)
        if ideal_readers is None:
            ideal_readers = self._source.ideal_readers
        self._ideal_readers = _int("ideal_readers", ideal_readers, 1)
        if isinstance(self._source, Cache) and not self._single_pass:
            _warn_if_shards_thrash(self._source, self._ideal_readers, self._world_size)
        self._core = self._make_core()
        self._next = 0
        self._pf: Any = None
        self._pid = os.getpid()
        self.seek(step=start_step)

    def _make_core(self) -> Any:
        if isinstance(self._source, UnpackedCache):
            return self._source._make_unpacked_core(
                self._batch_size,
                self._rank,
                self._world_size,
                self._ideal_readers,
                self._seed,
                self._reshuffle,
                self._dtype,
                self._pad_to or "longest",
            )
        return self._source._make_reader_core(
            self._batch_size,
            self._rank,
            self._world_size,
            self._ideal_readers,
            self._seed,
            self._reshuffle,
            self._single_pass,
            self._drop_last,
            self._dtype,
        )

    # ---- options --------------------------------------------------------------------------
    @property
    def tokens_seen(self) -> int:
        """Unpacked caches: real ids of the global batches read, counted on from the value a
        :meth:`load_state_dict` restores (0 for packed caches, where it is
        ``step * batch_size * seqlen``)."""
        return self._tokens_seen

    @property
    def cache(self) -> Union[Cache, Blend, UnpackedCache]:
        """The cache or blend read."""
        return self._source

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def ideal_readers(self) -> int:
        return self._ideal_readers

    @property
    def seqlen(self) -> int:
        return int(self._core.seqlen)

    @property
    def num_examples(self) -> Optional[int]:
        """Examples of a single pass (None when endless)."""
        return self._core.num_examples

    @property
    def num_steps(self) -> Optional[int]:
        """Batches of a single pass from step 0 (the last may be short unless ``drop_last``)."""
        n = self._core.num_examples
        if n is None:
            return None
        return n // self._batch_size if self._drop_last else -(-n // self._batch_size)

    @property
    def next_example(self) -> int:
        """Global index of the first example of the next batch."""
        return self._next

    @property
    def step(self) -> int:
        """Index of the next global batch (``next_example // batch_size``)."""
        return self._next // self._batch_size

    # ---- reading --------------------------------------------------------------------------
    def __iter__(self) -> Reader:
        return self

    def _has_batch(self, first: int) -> bool:
        if self._core.end_pending:
            return bool(self._core.has_batch(first))  # single pass following a build: may wait
        end = self._core.end
        return end is None or first < end

    def boundaries_of(
        self, batch: np.ndarray, layout: Optional[Literal["segment_ids", "position_ids", "cu_seqlens"]] = None
    ) -> Boundaries:
        """Document boundaries of ``batch`` (a batch of this reader) in ``layout`` (default:
        the reader's ``boundaries``), with the cache's EOT and padding ids."""
        layout = layout or self._boundaries or "segment_ids"
        meta = self._source.metadata if isinstance(self._source, Cache) else None
        eot = meta.get("eot_id") if meta is not None else self._source.eot_id
        pad = meta.get("pad_id") if meta is not None else self._source.pad_id
        if eot is None:
            raise ConfigError("the cache records no eot_id: document boundaries cannot be found")
        return document_boundaries(batch, eot_id=eot, pad_id=pad, layout=layout)

    def __next__(self) -> Any:
        batch = self._next_batch()
        if self._unpacked:
            b = make_batch(batch)
            self._tokens_seen += b.num_tokens
            return b
        return batch if self._boundaries is None else (batch, self.boundaries_of(batch))

    def _wrap(self, raw: Any) -> Any:
        return make_batch(raw) if self._unpacked else raw

    def _next_batch(self) -> np.ndarray:
        if not (self._pf is not None and self._core.end_pending) and not self._has_batch(self._next):
            self._close_prefetch()
            raise StopIteration
        if self._prefetch == 0:
            batch = self._core.batch(self._next)
        else:
            if self._pf is None or self._pid != os.getpid():
                # First batch, after a seek, or in a forked child (the parent's threads are gone).
                self._pid = os.getpid()
                self._pf = self._core.prefetch(self._next, self._threads, self._prefetch)
            try:
                got = self._pf.next()
            except BaseException:
                self._pf = None  # restart cleanly at the same position on the next call
                raise
            if got is None:
                self._pf = None
                raise StopIteration
            first, batch = got
            assert first == self._next, (first, self._next)
        self._next += self._batch_size
        return batch

    def pairs(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Iterate ``(inputs, targets)`` shifted by one token (see :func:`shift_targets`): for
        a packed cache read without ``boundaries`` (shift an unpacked batch's ``tokens``, or a
        batch and its boundaries, yourself)."""
        if self._unpacked or self._boundaries is not None:
            what = "an unpacked cache's batches" if self._unpacked else f"batches with boundaries={self._boundaries!r}"
            raise ConfigError(f"pairs() shifts plain batches of contexts, not {what}")
        for batch in self:
            yield shift_targets(batch)

    def _stream(self, first: int, every: int = 1, count: Optional[int] = None) -> Iterator[np.ndarray]:
        """Batches starting at examples ``first + k * every * batch_size`` for k < ``count``
        (None: until the end), read ahead on fresh threads; the position is not used or changed."""
        k = 0
        if self._prefetch == 0:
            while count is None or k < count:
                at = first + k * every * self._batch_size
                if not self._has_batch(at):
                    return
                yield self._wrap(self._core.batch(at))
                k += 1
            return
        pf = self._core.prefetch(first, self._threads, self._prefetch, every)
        while count is None or k < count:
            got = pf.next()
            if got is None:
                return
            yield self._wrap(got[1])
            k += 1

    def batch_at(self, step: int) -> np.ndarray:
        """This rank's slice of global batch ``step`` (random access; the position is unchanged)."""
        first = _int("step", step, 0) * self._batch_size
        if first + self._batch_size > _MAX_EXAMPLE:
            raise ConfigError(f"step {step} starts at example {first}, beyond the supported range (2**62)")
        return self._wrap(self._core.batch(first))

    def locate(self, example: int) -> Tuple[int, int, int]:
        """(component, chunk, index inside the chunk's tar) of global example ``example``; for
        an unpacked cache the component is the length bin."""
        return tuple(self._core.locate(_int("example", example, 0)))  # type: ignore[return-value]

    # ---- seek and state -------------------------------------------------------------------
    def seek(self, *, step: Optional[int] = None, example: Optional[int] = None, tokens: Optional[int] = None) -> None:
        """Move to global batch ``step``, to global ``example``, or to a token count (exactly
        one of them). O(1): no data is read and nothing is built."""
        given = [k for k, v in (("step", step), ("example", example), ("tokens", tokens)) if v is not None]
        if len(given) != 1:
            raise ConfigError(f"seek takes exactly one of step, example, tokens (got {given or 'none'})")
        if step is not None:
            first = _int("step", step, 0) * self._batch_size
        elif example is not None:
            first = _int("example", example, 0)
        else:
            t = _int("tokens", tokens, 0)
            if self._unpacked:
                raise ConfigError("seek(tokens=...) needs fixed-length contexts: seek an unpacked cache by step")
            if t % self.seqlen:
                raise ConfigError(f"tokens={t} is not a multiple of seqlen {self.seqlen}")
            first = t // self.seqlen
        if self._unpacked and first % self._batch_size:
            raise ConfigError(
                f"example {first} does not start a batch: batches of an unpacked cache each come from one bin, "
                f"so seek to a multiple of batch_size {self._batch_size}"
            )
        if first + self._batch_size > _MAX_EXAMPLE:
            raise ConfigError(f"example {first} is beyond the supported range (2**62)")
        self._next = first
        self._close_prefetch()

    def _options(self) -> Dict[str, Any]:
        return {
            "ideal_readers": self._ideal_readers,
            "seed": self._seed,
            "reshuffle": self._reshuffle,
            "single_pass": self._single_pass,
            "batch_size": self._batch_size,
        }

    @property
    def fingerprint(self) -> str:
        """sha256 of the cache's (or blend's) fingerprint, the order definition and the order
        options."""
        return self._fingerprint_with(self._source.fingerprint)

    def _fingerprint_with(self, cache_fingerprint: str) -> str:
        h = hashlib.sha256()
        h.update(cache_fingerprint.encode())
        h.update(b"\0" + self._core.source_description.encode() + b"\0")
        h.update(json.dumps(self._options(), sort_keys=True).encode())
        return h.hexdigest()

    def state_dict(self) -> Dict[str, Any]:
        """JSON-serialisable position: resume with :meth:`load_state_dict`, any world_size."""
        return {
            "tokshuf_reader": STATE_VERSION,
            "next_example": self._next,
            "step": self.step,
            "fingerprint": self.fingerprint,
            "cache": self._source.fingerprint,
            "options": self._options(),
            "world_size": self._world_size,
            "rank": self._rank,
            **({"tokens_seen": self._tokens_seen} if self._unpacked else {}),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`. The cache and the order options must be the same
        (else :class:`tokshuf.StateMismatchError`); world_size and rank may differ."""
        if not isinstance(state, dict) or state.get("tokshuf_reader") != STATE_VERSION:
            raise StateMismatchError(f"not a tokshuf reader state (version {STATE_VERSION}): {repr(state)[:200]}")
        # A state saved while following the build names the cache by its recipe.
        accepted = getattr(self._source, "_state_fingerprints", lambda: [self._source.fingerprint])()
        if state.get("cache") not in accepted:
            raise StateMismatchError(
                "state was saved for another cache or blend (or it changed): "
                f"{str(state.get('cache'))[:16]!r} != {self._source.fingerprint[:16]!r}"
            )
        theirs = state.get("options", {})
        if not isinstance(theirs, dict):
            raise StateMismatchError(f"state's options are not a dict: {repr(theirs)[:200]}")
        diff = [f"{k} ({theirs.get(k)!r} -> {v!r})" for k, v in self._options().items() if theirs.get(k) != v]
        if diff:
            raise StateMismatchError("state was saved with other order options: " + ", ".join(diff))
        if state.get("fingerprint") != self._fingerprint_with(state["cache"]):
            raise StateMismatchError("state was saved with another order definition (tokshuf version?)")
        self.seek(example=_int("next_example", state.get("next_example"), 0))
        self._tokens_seen = _int("tokens_seen", state.get("tokens_seen", 0), 0)

    # ---- lifetime -------------------------------------------------------------------------
    def _close_prefetch(self) -> None:
        self._pf = None

    def close(self) -> None:
        """Stop read-ahead threads (they also stop when the reader is garbage-collected)."""
        self._close_prefetch()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_core"] = None
        state["_pf"] = None
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._core = self._make_core()
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return (
            f"Reader({self._source!r}, batch_size={self._batch_size}, rank={self._rank}, "
            f"world_size={self._world_size}, ideal_readers={self._ideal_readers}, step={self.step})"
        )
