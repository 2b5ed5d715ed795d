"""Weighted blends of several caches (docs/format.md §7).

``Blend([(cache_or_path, weight), ...])`` fixes a periodic schedule of period ``quantum``: the
weights become integer shares ``q_i`` summing to the quantum, and one period is drawn with the
corrected greedy rule. Blended example ``m`` is then example ``(m // D) * q_k + C`` of component
``k``, with ``(k, C) = schedule[m % D]``: an O(1) lookup, no per-sample index arrays, any number
of components. ``tokshuf.Reader(blend, ...)`` reads blended example ``m`` exactly where it would
read ``example[m]`` of a single cache, and each component orders its own examples as a single
cache does (docs/format.md §6, with the reader's R* and the blend's seed).
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._cache import Cache
from ._core import BlendSchedule
from .exceptions import ConfigError

DEFAULT_QUANTUM = 1 << 16
MAX_QUANTUM = 1 << 30  # the core's bound: 12 bytes per draw


@dataclass(frozen=True)
class BlendComponent:
    """One cache of a blend and its weight."""

    cache: Cache
    weight: float

    @property
    def path(self) -> Path:
        return Path(self.cache.path)

    @property
    def num_examples(self) -> int:
        return len(self.cache)

    @property
    def meta(self) -> Mapping[str, Any]:
        """The cache's tokshuf.json."""
        return self.cache.metadata


def _open_component(source: Any) -> Cache:
    """A component given as a path is opened (and checked) as a :class:`tokshuf.Cache`."""
    if isinstance(source, Cache):
        if source.following:
            raise ConfigError(
                f"{source.path}: opened with follow=True while its build runs; blends read finished caches "
                "(open it again once the build is complete)"
            )
        return source
    if isinstance(source, (str, os.PathLike)):
        return Cache(source)
    raise ConfigError(f"a blend component must be a cache or a cache path, not {type(source).__name__}")


def _check_weight(weight: Any, path: Path) -> float:
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
        raise ConfigError(f"{path}: blend weight must be a number, not {weight!r}")
    try:
        w = float(weight)
    except OverflowError:
        raise ConfigError(f"{path}: blend weight is too large for a float (over 1.8e308)") from None
    if not (math.isfinite(w) and w > 0):
        raise ConfigError(f"{path}: blend weight must be finite and > 0, not {weight!r}")
    return w


def _tokenizer_identity(meta: Mapping[str, Any]) -> Tuple[Any, Any]:
    tok = meta.get("tokenizer")
    return (tok.get("sha256"), tok.get("vocab_size")) if isinstance(tok, Mapping) else (tok, None)


def _tokenizer_name(meta: Mapping[str, Any]) -> Any:
    tok = meta.get("tokenizer")
    return tok.get("spec") if isinstance(tok, Mapping) else tok


def _check_compatible(components: Sequence[BlendComponent]) -> None:
    """All components must give examples of one shape and meaning."""
    first = components[0]
    for c in components[1:]:
        if first.cache.seqlen != c.cache.seqlen:
            detail = f"seqlen {first.cache.seqlen} vs {c.cache.seqlen}"
        elif _tokenizer_identity(first.meta) != _tokenizer_identity(c.meta):
            detail = (
                f"tokenizer {_tokenizer_name(first.meta)!r} vs {_tokenizer_name(c.meta)!r} (different vocabularies)"
            )
        elif first.cache.dtype != c.cache.dtype:
            detail = f"dtype {first.cache.dtype} vs {c.cache.dtype}"
        else:
            # Training code masks padding and splits documents by one id each.
            for key in ("eot_id", "pad_id"):
                if first.meta.get(key) != c.meta.get(key):
                    detail = f"{key} {first.meta.get(key)} vs {c.meta.get(key)}"
                    break
            else:
                continue
        raise ConfigError(f"cannot blend {first.path} and {c.path}: {detail}")
    seen: Dict[Path, int] = {}
    for k, c in enumerate(components):
        key = c.path.resolve()
        if key in seen:
            warnings.warn(
                f"blend: {c.path} is listed twice (components {seen[key]} and {k}); both read it in "
                "the same order, so its examples repeat early. List it once with the summed weight.",
                stacklevel=3,
            )
        seen.setdefault(key, k)


class Blend:
    """Several caches mixed by weight, readable like one cache.

    Args:
        components: ``(cache_or_path, weight)`` pairs (or a mapping path -> weight); paths are
            opened as :class:`tokshuf.Cache` (which checks them). Weights are any positive
            numbers; they are normalised. All caches must share seqlen, tokenizer, dtype, EOT
            and padding ids.
        seed: order seed handed to every component (how each orders its own examples, docs/format.md §6); a :class:`tokshuf.Reader` over the blend uses it. The schedule itself has no
            randomness.
        quantum: period D of the schedule. Each component gets ``q_i ~= D * w_i / sum(w)``
            draws per period (largest remainder); a component whose share rounds to 0 gets 1
            draw (with a warning, see :attr:`raised`). Needs ``quantum >= len(components)``.
            Memory is 12 bytes per draw.
    """

    def __init__(
        self,
        components: Union[Iterable[Tuple[Any, float]], Mapping[Any, float]],
        *,
        seed: int = 0,
        quantum: int = DEFAULT_QUANTUM,
    ) -> None:
        pairs = list(components.items()) if isinstance(components, Mapping) else list(components)
        if not pairs:
            raise ConfigError("a blend needs at least one (cache, weight) pair")
        comps: List[BlendComponent] = []
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ConfigError(f"blend component {i} must be a (cache_or_path, weight) pair, not {pair!r}")
            source, weight = pair
            cache = _open_component(source)
            w = _check_weight(weight, Path(cache.path))
            if len(cache) == 0:
                raise ConfigError(f"{cache.path}: cache has no examples, it cannot be blended")
            comps.append(BlendComponent(cache, w))
        _check_compatible(comps)
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
            raise ConfigError(f"seed must be an integer in [0, 2**64), not {seed!r}")
        if isinstance(quantum, bool) or not isinstance(quantum, numbers.Integral):
            raise ConfigError(f"quantum must be an integer, not {quantum!r}")
        if not 1 <= quantum <= MAX_QUANTUM:
            raise ConfigError(f"quantum must be in 1..{MAX_QUANTUM}, not {quantum}")
        if quantum < len(comps):
            raise ConfigError(
                f"quantum {quantum} is smaller than the number of caches ({len(comps)}): every cache "
                "needs at least one draw per period; raise the quantum"
            )
        self.components: Tuple[BlendComponent, ...] = tuple(comps)
        self.seed = int(seed)
        self.schedule = BlendSchedule([c.weight for c in comps], int(quantum))
        self.sizes = np.array([c.num_examples for c in comps], dtype=np.uint64)
        first = comps[0].meta
        self.seqlen: int = comps[0].cache.seqlen
        self.dtype: np.dtype = comps[0].cache.dtype
        self.tokenizer: Any = first.get("tokenizer")
        self.eot_id: Optional[int] = first.get("eot_id")
        self.pad_id: Optional[int] = first.get("pad_id")
        if self.raised:
            names = ", ".join(str(comps[k].path) for k in self.raised[:5])
            more = f" and {len(self.raised) - 5} more" if len(self.raised) > 5 else ""
            warnings.warn(
                f"blend: the share of {names}{more} rounds to 0 draws per {self.quantum}; raised to "
                f"1 draw each (more than asked). Raise quantum for exact small weights.",
                stacklevel=2,
            )

    # -- the schedule -------------------------------------------------------------------------

    @property
    def quantum(self) -> int:
        return self.schedule.quantum

    @property
    def quanta(self) -> List[int]:
        """Draws of each component per period (they sum to the quantum)."""
        return self.schedule.quanta

    @property
    def raised(self) -> List[int]:
        """Components whose share rounded to 0 and that get 1 draw per period anyway."""
        return self.schedule.raised

    @property
    def weights(self) -> List[float]:
        return [c.weight for c in self.components]

    @property
    def num_components(self) -> int:
        return len(self.components)

    def locate(self, m: int, *, single_pass: bool = False) -> Tuple[int, int]:
        """Blended example ``m`` -> ``(component, example index in that component)``.

        The index counts the component's own examples in its own order (docs/format.md §6: it is the
        ``i`` of that component's ``example[i]``). With ``single_pass`` it wraps modulo the
        component's size, so it is always a valid manifest-order index.
        """
        k, e = self.schedule.locate(self._check_index(m))
        if single_pass:
            e %= int(self.sizes[k])
        return int(k), int(e)

    def locate_many(self, ms: Any, *, single_pass: bool = False) -> Tuple[np.ndarray, np.ndarray]:
        """Vectorised :meth:`locate` (the reader's entry point).

        ``ms``: array-like of non-negative blended indices. Returns ``(ks, es)``: uint32
        component numbers and uint64 example indices, same shape as ``ms``. O(1) per index,
        computed in Rust without the GIL.
        """
        arr = np.asarray(ms)
        if arr.dtype != np.uint64:
            if arr.size and not np.issubdtype(arr.dtype, np.integer):
                raise ConfigError(f"blended indices must be integers, not {arr.dtype}")
            if arr.size and arr.min() < 0:
                raise ConfigError("blended indices must be >= 0")
            arr = arr.astype(np.uint64)
        flat = np.ascontiguousarray(arr.reshape(-1))
        ks, es = self.schedule.locate_many(flat, self.sizes if single_pass else None)
        return ks.reshape(arr.shape), es.reshape(arr.shape)

    def position(self, k: int, e: int) -> int:
        """Inverse of :meth:`locate`: the blended index of component ``k``'s example ``e``."""
        return int(self.schedule.position(k, self._check_index(e)))

    def counts(self, num_examples: int) -> np.ndarray:
        """Examples drawn from each component among blended examples ``0..num_examples``."""
        return np.array(self.schedule.counts(self._check_index(num_examples)), dtype=np.uint64)

    def single_pass_length(self) -> int:
        """Blended examples needed to draw every example of every component at least once.

        The natural length of a single (evaluation) pass: small components wrap around (their
        indices are taken modulo their size) until the component that takes longest is done.
        """
        return int(self.schedule.cover_length(list(map(int, self.sizes))))

    @property
    def fingerprint(self) -> str:
        """Digest of everything that fixes the blended order apart from the reader's options:
        the components' content (:attr:`tokshuf.Cache.fingerprint`), the shares, the quantum
        and the seed. Part of a reader's state."""
        h = hashlib.sha256()
        h.update(json.dumps({"quantum": self.quantum, "quanta": self.quanta, "seed": self.seed}).encode())
        for c in self.components:
            h.update(c.cache.fingerprint.encode())
        return h.hexdigest()

    # -- reading ------------------------------------------------------------------------------

    @property
    def ideal_readers(self) -> int:
        """Default R* of a reader over the blend: the smallest default of its caches (see
        :attr:`tokshuf.Cache.ideal_readers`; min(64, chunks) unless the cache records one), so
        no cache gets more streams than it has chunks. The same R* orders every component."""
        return min(c.cache.ideal_readers for c in self.components)

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
        return self.schedule.reader_core(
            [c.cache._inner for c in self.components],
            batch_size,
            rank,
            world_size,
            ideal_readers,
            seed,
            reshuffle,
            single_pass,
            drop_last,
            dtype,
        )

    @staticmethod
    def _check_index(m: Any) -> int:
        if isinstance(m, bool) or not isinstance(m, numbers.Integral) or not 0 <= m < 2**64:
            raise ConfigError(f"index must be an integer in [0, 2**64), not {m!r}")
        return int(m)

    # -- reporting ----------------------------------------------------------------------------

    def describe(self, num_examples: Optional[int] = None) -> BlendDescription:
        """Requested vs achieved ratios (``print()`` it for a table, ``.to_dict()`` for data).

        Achieved is what every period of the schedule delivers, ``q_i / D``. With
        ``num_examples`` (e.g. steps * global batch size) it also gives each component's count
        in that prefix, its ratio, and how many passes over the component that is.
        """
        s = self.schedule
        rows = []
        counts = None if num_examples is None else self.counts(num_examples)
        for k, c in enumerate(self.components):
            row: Dict[str, Any] = {
                "component": k,
                "path": str(c.path),
                "weight": c.weight,
                "num_examples": c.num_examples,
                "requested": s.requested[k],
                "quanta": s.quanta[k],
                "achieved": s.achieved[k],
                "raised": k in set(s.raised),
            }
            if counts is not None:
                row["drawn"] = int(counts[k])
                row["drawn_ratio"] = int(counts[k]) / num_examples if num_examples else 0.0
                row["epochs"] = int(counts[k]) / c.num_examples
            rows.append(row)
        return BlendDescription(
            quantum=self.quantum,
            seed=self.seed,
            max_lag=s.max_lag,
            max_lead=s.max_lead,
            num_examples=num_examples,
            single_pass_length=self.single_pass_length(),
            rows=rows,
        )

    def __repr__(self) -> str:
        return f"Blend({len(self.components)} caches, quantum={self.quantum}, seed={self.seed})"


@dataclass(frozen=True)
class BlendDescription:
    """What :meth:`Blend.describe` returns: one row per component, plus the schedule's bounds."""

    quantum: int
    seed: int
    max_lag: float
    max_lead: float
    num_examples: Optional[int]
    single_pass_length: int
    rows: List[Dict[str, Any]]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "quantum": self.quantum,
            "seed": self.seed,
            "max_lag": self.max_lag,
            "max_lead": self.max_lead,
            "num_examples": self.num_examples,
            "single_pass_length": self.single_pass_length,
            "components": [dict(r) for r in self.rows],
        }

    def __str__(self) -> str:
        head = ["#", "requested", "achieved", "q/D", "examples"]
        if self.num_examples is not None:
            head += ["drawn", "epochs"]
        head.append("path")
        lines = []
        for r in self.rows:
            cells = [
                str(r["component"]),
                f"{r['requested']:.6f}",
                f"{r['achieved']:.6f}" + ("*" if r["raised"] else ""),
                f"{r['quanta']}/{self.quantum}",
                str(r["num_examples"]),
            ]
            if self.num_examples is not None:
                cells += [str(r["drawn"]), f"{r['epochs']:.3f}"]
            cells.append(r["path"])
            lines.append(cells)
        widths = [max(len(x) for x in col) for col in zip(head, *lines)]
        fmt = lambda cells: "  ".join(  # noqa: E731
            c if i == len(cells) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )
        out = [fmt(head)] + [fmt(c) for c in lines]
        out.append(
            f"period {self.quantum} draws; a component runs at most {self.max_lead:.3f} samples ahead "
            f"of its share and at most {self.max_lag:.3f} behind; single pass: "
            f"{self.single_pass_length} examples"
        )
        if any(r["raised"] for r in self.rows):
            out.append("* share rounded to 0, raised to 1 draw per period (raise quantum to follow the weight)")
        return "\n".join(out)
