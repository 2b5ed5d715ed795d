"""Document boundaries of packed contexts, computed at read time from the EOT ids (no extra
storage), in the layouts attention kernels take to keep documents from attending to each other.

In a ``concat`` cache every document is ``[bos] + ids + [eot]`` and contexts cut the
concatenation anywhere, so within one row (context):

- a document ends at (and includes) each EOT; the next one starts right after it. The first
  document of a row may be the continuation of one that began in an earlier context: it is
  simply document 0 of the row.
- padding exists only at the end of a row (the stitched or padded tail of a file): the trailing
  run of ``pad_id`` after the row's last real EOT. Documents are never empty (empty ones are
  skipped), so when ``pad_id == eot_id`` the first EOT of a trailing run is taken as the last
  document's own and the rest as padding. A document piece that is only its EOT (a document cut
  just before its EOT, a file tail of one EOT) at the end of a row, after another EOT, is then
  taken for padding too: the ids alone cannot tell them apart. A distinct ``pad_id`` makes the
  boundaries exact. Padding is not a document: segment id -1, position 0; in
  ``cu_seqlens`` it is one segment of its own, so the segments still cover every token.

Layouts (``B`` rows of ``L`` tokens):

- ``"segment_ids"``: int32 ``(B, L)``, documents numbered 0, 1, ... in each row, padding -1
  (PyTorch ``flex_attention`` document masks: ``seg[q] == seg[k]``).
- ``"position_ids"``: int32 ``(B, L)``, the position inside each document, restarting at 0.
- ``"cu_seqlens"``: ``(cu_seqlens, max_seqlen)``: int32 cumulative segment lengths over the
  flattened batch, starting at 0 and ending at ``B * L`` (FlashAttention's varlen kernels), and the
  longest segment.
"""

from __future__ import annotations

from typing import Literal, Optional, Tuple, Union

import numpy as np

from .exceptions import ConfigError

LAYOUTS = ("segment_ids", "position_ids", "cu_seqlens")

Boundaries = Union[np.ndarray, Tuple[np.ndarray, int]]


def _padding(batch: np.ndarray, eot_id: int, pad_id: Optional[int]) -> np.ndarray:
    """Boolean mask of the padding at the end of each row."""
    rows, length = batch.shape
    if pad_id is None or length == 0:
        return np.zeros(batch.shape, dtype=bool)
    tail = (batch == pad_id)[:, ::-1]
    run = np.where(tail.all(axis=1), length, np.argmin(tail, axis=1))
    if pad_id == eot_id:
        run = np.maximum(run - 1, 0)  # the run's first EOT ends the last document
    else:
        # Padding follows the last document's EOT; a trailing pad id after anything else is text.
        before = length - run - 1
        ok = (before >= 0) & (batch[np.arange(rows), np.clip(before, 0, length - 1)] == eot_id)
        run = np.where(ok, run, 0)
    return np.arange(length)[None, :] >= (length - run)[:, None]


def document_boundaries(
    batch: np.ndarray,
    *,
    eot_id: int,
    pad_id: Optional[int] = None,
    layout: Literal["segment_ids", "position_ids", "cu_seqlens"] = "segment_ids",
) -> Boundaries:
    """Where documents start in each row of ``batch`` (see the module notes for the rules).

    Args:
        batch: ``(B, L)`` token ids of packed contexts, as a :class:`tokshuf.Reader` yields.
        eot_id: the cache's end-of-text id (tokshuf.json ``eot_id``).
        pad_id: the cache's padding id (tokshuf.json ``pad_id``); None if it never pads.
        layout: ``"segment_ids"``, ``"position_ids"`` or ``"cu_seqlens"``.

    Returns:
        An int32 ``(B, L)`` array, or ``(cu_seqlens, max_seqlen)`` for ``"cu_seqlens"``.
    """
    if layout not in LAYOUTS:
        raise ConfigError(f"boundaries={layout!r}: expected one of {', '.join(LAYOUTS)}")
    batch = np.asarray(batch)
    if batch.ndim != 2:
        raise ConfigError(f"document_boundaries takes a (batch, seqlen) array, not shape {batch.shape}")
    rows, length = batch.shape
    pad = _padding(batch, eot_id, pad_id)
    start = np.zeros(batch.shape, dtype=bool)
    start[:, :1] = True
    start[:, 1:] = batch[:, :-1] == eot_id
    start &= ~pad
    if layout == "segment_ids":
        seg = np.cumsum(start, axis=1, dtype=np.int32) - 1
        seg[pad] = -1
        return seg
    if layout == "position_ids":
        idx = np.broadcast_to(np.arange(length, dtype=np.int32), batch.shape)
        last_start = np.maximum.accumulate(np.where(start, idx, 0), axis=1)
        pos = (idx - last_start).astype(np.int32)
        pos[pad] = 0
        return pos
    # A padding run is one segment of its own, so the segments tile the flattened batch.
    pad_start = pad & ~np.concatenate([np.zeros((rows, 1), dtype=bool), pad[:, :-1]], axis=1)
    flat = np.flatnonzero((start | pad_start).ravel())
    cu = np.append(flat, rows * length).astype(np.int32)
    max_seqlen = int(np.diff(cu).max()) if len(cu) > 1 else 0
    return cu, max_seqlen
