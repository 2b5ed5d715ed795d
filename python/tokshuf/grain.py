"""Grain adapter: ``tokshuf.grain.DataSource``, a random-access source for Google's Grain.

Record ``i`` of a :class:`DataSource` is ``example[i]`` of the global example order of a cache
(docs/format.md §6), or blended example ``i`` of a :class:`tokshuf.Blend` (§7): each record is
located in O(1) and read with no index arrays, so Grain can ask for any record in any order.
The source itself needs only NumPy; :func:`map_dataset` needs ``grain`` (``pip install grain``).

Because records follow the global order, Grain's own slicing and batching reproduce
:class:`tokshuf.Reader` exactly: for rank ``r`` of ``R`` and a global batch of ``B``,

    grain.MapDataset.source(DataSource(cache))[r::R].batch(B // R)

yields, as batch ``b``, the rows ``tokshuf.Reader(cache, batch_size=B, rank=r, world_size=R)``
yields as its batch ``b``, for every ``R`` (that is :func:`map_dataset`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Literal, Optional, Sequence, Union

import numpy as np

from ._blend import Blend
from ._cache import Cache, PathLike
from ._reader import Reader
from .exceptions import ConfigError

if TYPE_CHECKING:
    import grain

__all__ = ["DataSource", "map_dataset"]


class DataSource:
    """A Grain ``RandomAccessDataSource`` over a cache or a blend.

    ``source[i]`` is a 1-D array of ``seqlen`` ids: ``example[i]`` of the order a
    :class:`tokshuf.Reader` with the same options reads (docs/format.md §6; §7 for a blend).

    Args:
        source: a :class:`tokshuf.Cache`, a cache path (local or an object-store URL), or a
            :class:`tokshuf.Blend`.
        num_records: the number of records Grain sees (``len(source)``). The order itself is
            endless (epochs after the first are reshuffled unless ``reshuffle=False``), so a
            source for training can be as long as the run: e.g. ``steps * global_batch``.
            Default: one epoch of a cache (its number of contexts), or for a blend the length
            of its single pass (:meth:`tokshuf.Blend.single_pass_length`). With
            ``single_pass=True`` it is that pass's length and may not be given.
        ideal_readers: R*, which fixes the order (default: the cache's own; see
            :class:`tokshuf.Reader`).
        seed: the seed of the epochs' reshuffles (default 0; a blend carries its own).
        reshuffle: reshuffle chunks and contexts in epochs after the first (default), or repeat
            epoch 0.
        single_pass: every context once, in manifest order (evaluation).
        dtype: the dtype of the returned arrays.
    """

    def __init__(
        self,
        source: Union[Cache, Blend, PathLike],
        *,
        num_records: Optional[int] = None,
        ideal_readers: Optional[int] = None,
        seed: Optional[int] = None,
        reshuffle: bool = True,
        single_pass: bool = False,
        dtype: Literal["int32", "int64", "uint16", "uint32"] = "int32",
    ) -> None:
        # A reader of batch size 1 on one rank: its batch b is example b, located in O(1).
        self._reader = Reader(
            source,
            batch_size=1,
            ideal_readers=ideal_readers,
            seed=seed,
            reshuffle=reshuffle,
            single_pass=single_pass,
            prefetch=0,
            dtype=dtype,
        )
        if self._reader._unpacked:
            raise ConfigError(
                "an unpacked (packing='none') cache has examples of many lengths: Grain's records are "
                "1-D arrays of seqlen ids; read it with tokshuf.Reader (UnpackedBatch) instead"
            )
        if single_pass:
            if num_records is not None:
                raise ConfigError("num_records: a single pass has its own length; leave num_records out")
            n = self._reader.num_examples
            if n is None:
                raise ConfigError("a single pass over a cache still being built has no length yet")
            self._len = int(n)
        elif num_records is None:
            src = self._reader.cache
            self._len = src.single_pass_length() if isinstance(src, Blend) else len(src)
        else:
            if isinstance(num_records, bool) or not isinstance(num_records, (int, np.integer)) or num_records < 0:
                raise ConfigError(f"num_records must be an integer >= 0, not {num_records!r}")
            self._len = int(num_records)

    @property
    def reader(self) -> Reader:
        """The order's definition (a batch-size-1 :class:`tokshuf.Reader`): its
        ``fingerprint`` names the cache and the order options."""
        return self._reader

    @property
    def seqlen(self) -> int:
        return self._reader.seqlen

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> np.ndarray:
        i = int(index)
        if not 0 <= i < self._len:
            raise IndexError(f"record {index} out of range (the source has {self._len})")
        return self._reader.batch_at(i)[0]

    def _getitems(self, indices: Sequence[int]) -> List[np.ndarray]:
        """Grain's batched read: every record is located on its own, in O(1)."""
        return [self[i] for i in indices]

    def __repr__(self) -> str:
        # Grain compares the source's repr when it restores a checkpoint: it names the cache's
        # content and the order options, so a checkpoint only loads on the same order.
        return (
            f"tokshuf.grain.DataSource({self._reader.cache.fingerprint[:16]}, records={self._len}, "
            f"order={self._reader.fingerprint[:16]})"
        )


def map_dataset(
    source: Union[Cache, Blend, PathLike, DataSource],
    *,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    drop_remainder: bool = False,
    **options: Any,
) -> grain.MapDataset:
    """This rank's batches as a ``grain.MapDataset``: batch ``b`` holds exactly the rows
    ``tokshuf.Reader(source, batch_size=batch_size, rank=rank, world_size=world_size)`` gives
    as its batch ``b`` (global batch ``b`` is records ``[b*B, (b+1)*B)``; this rank takes every
    ``world_size``-th one starting at ``rank``).

    Args:
        source: a cache, a cache path, a blend, or a :class:`DataSource`.
        batch_size: the global batch size ``B`` (divisible by ``world_size``).
        rank: this process's index (``jax.process_index()``).
        world_size: the number of processes (``jax.process_count()``).
        drop_remainder: drop a last short batch (of a single pass or of ``num_records``).
        **options: the :class:`DataSource` options (``num_records``, ``seed``, ...) when
            ``source`` is not a DataSource already.
    """
    import grain

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1, not {batch_size!r}")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise ConfigError(f"rank {rank!r} must be in [0, world_size), world_size {world_size!r} >= 1")
    if batch_size % world_size:
        raise ConfigError(f"batch_size {batch_size} must be divisible by world_size {world_size}")
    if isinstance(source, DataSource):
        if options:
            raise ConfigError(f"options {sorted(options)} belong to the DataSource already made")
        ds = source
    else:
        ds = DataSource(source, **options)
    return grain.MapDataset.source(ds)[rank::world_size].batch(batch_size // world_size, drop_remainder=drop_remainder)
