"""PyTorch adapter: ``tokshuf.torch.ReaderDataset`` (torch is an optional dependency).

Use it with ``DataLoader(ds, batch_size=None, num_workers=W)``: the dataset yields whole batches
(this rank's slice, as tensors). With W workers, worker w yields the rank's batches w, w+W,
w+2W, ...; the DataLoader takes one from each worker in turn, so the sequence it yields is
exactly the plain :class:`tokshuf.Reader` sequence, for any W. Read-ahead threads start inside
each worker when it begins iterating, never in the main process.

Checkpointing: ``ds.state_dict(batches_seen)`` with the number of batches the training loop
took from the DataLoader since the dataset's start (the main process cannot see the workers'
position), and ``ds.load_state_dict(state)`` before iterating again.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:  # pragma: no cover - exercised only without torch
    raise ImportError("tokshuf.torch needs PyTorch (pip install torch)") from e

import numpy as np

from ._reader import Reader
from ._unpacked import UnpackedBatch

__all__ = ["ReaderDataset"]


class ReaderDataset(IterableDataset):  # type: ignore[type-arg,misc]
    """An ``IterableDataset`` over a :class:`tokshuf.Reader`'s batches.

    Over an unpacked cache it yields :class:`tokshuf.UnpackedBatch` tuples of tensors (``shift``
    does not apply: shift ``tokens`` and mask the targets past each row's length yourself).

    Args:
        reader: fixes the cache, rank, world size and options; its position when the dataset
            is made (or loaded with :meth:`load_state_dict`) is where iteration starts.
        steps: the number of batches to yield (None: endless, or to the end of a single pass).
        shift: yield ``(inputs, targets)`` shifted by one token instead of whole batches (with
            the reader's ``boundaries``, those of the inputs).
    """

    def __init__(self, reader: Reader, *, steps: Optional[int] = None, shift: bool = False) -> None:
        super().__init__()
        self._reader = reader
        self._start = reader.next_example
        self._start_tokens = reader._tokens_seen
        self._steps = steps
        self._shift = shift
        self._seen = 0
        self._tokens = 0  # real tokens of the unpacked batches yielded in this process

    @property
    def reader(self) -> Reader:
        return self._reader

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        count = None
        if self._steps is not None:
            count = max(0, -(-(self._steps - worker) // workers))
        first = self._start + worker * self._reader.batch_size
        for batch in self._reader._stream(first, every=workers, count=count):
            if info is None:
                self._seen += 1
            if isinstance(batch, UnpackedBatch):
                if info is None:
                    self._tokens += batch.num_tokens
                yield UnpackedBatch(
                    torch.from_numpy(batch.tokens),
                    torch.from_numpy(batch.lengths),
                    torch.from_numpy(batch.attention_mask),
                    batch.bin,
                    batch.num_tokens,
                )
                continue
            t = torch.from_numpy(batch)
            out = (t[:, :-1], t[:, 1:]) if self._shift else t
            if self._reader._boundaries is None:
                yield out
            else:
                # Of what is yielded: the inputs when shifted, so the shapes agree.
                b = self._reader.boundaries_of(batch[:, :-1] if self._shift else batch)
                yield (
                    out,
                    (
                        tuple(torch.from_numpy(x) if isinstance(x, np.ndarray) else x for x in b)
                        if isinstance(b, tuple)
                        else torch.from_numpy(b)
                    ),
                )

    def state_dict(self, batches_seen: Optional[int] = None) -> Dict[str, Any]:
        """Reader state after ``batches_seen`` batches of this dataset (default: the batches
        yielded in this process, which is right only with ``num_workers=0``). Over an unpacked
        cache the state's ``tokens_seen`` counts those batches' real tokens: from the batches
        yielded here, or (for another count, as with workers) by reading the batches' lengths
        again."""
        n = self._seen if batches_seen is None else int(batches_seen)
        r = self._reader
        saved = r.next_example
        r.seek(example=self._start + n * r.batch_size)
        try:
            state = r.state_dict()
        finally:
            r.seek(example=saved)
        if r._unpacked:
            tokens = self._tokens if n == self._seen else sum(b.num_tokens for b in r._stream(self._start, count=n))
            state["tokens_seen"] = self._start_tokens + tokens
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._reader.load_state_dict(state)
        self._start = self._reader.next_example
        self._start_tokens = self._reader._tokens_seen
        self._seen = 0
        self._tokens = 0
