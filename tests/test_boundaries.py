"""Document boundaries at read time (issue 14): segment ids, position ids and cu_seqlens of
packed contexts match the documents of the input, with padding told apart from documents
whether or not the padding id is the EOT id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tokshuf
from support.build import build
from support.corpus import make_docs, write_jsonl
from support.tokref import NEOX_JSON

EOT = 50256


def test_small_rows_by_hand():
    row = [[5, 6, EOT, 7, EOT, EOT, EOT], [8, EOT, 9, 9, 9, 9, EOT]]
    seg = tokshuf.document_boundaries(np.array(row), eot_id=EOT, pad_id=EOT)
    assert seg.tolist() == [[0, 0, 0, 1, 1, -1, -1], [0, 0, 1, 1, 1, 1, 1]]
    pos = tokshuf.document_boundaries(np.array(row), eot_id=EOT, pad_id=EOT, layout="position_ids")
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0, 0], [0, 1, 0, 1, 2, 3, 4]]
    cu, longest = tokshuf.document_boundaries(np.array(row), eot_id=EOT, pad_id=EOT, layout="cu_seqlens")
    assert cu.tolist() == [0, 3, 5, 7, 9, 14] and longest == 5 and cu.dtype == np.int32
    # A distinct padding id counts as padding only after an EOT.
    other = np.array([[5, EOT, 7, 1, 1], [5, 7, EOT, 1, 1]])
    assert tokshuf.document_boundaries(other, eot_id=EOT, pad_id=1).tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, -1, -1]]
    with pytest.raises(tokshuf.ConfigError, match="boundaries="):
        tokshuf.document_boundaries(other, eot_id=EOT, layout="masks")


def expected(stream_len: int, doc_starts: np.ndarray, rows: int, seqlen: int) -> np.ndarray:
    """Segment ids straight from the definition: tokens of row k are global positions
    k*L .. k*L+L-1; a segment starts at the row start and at every document start."""
    seg = np.empty((rows, seqlen), dtype=np.int64)
    for k in range(rows):
        pos = np.arange(k * seqlen, (k + 1) * seqlen)
        starts = doc_starts[(doc_starts > k * seqlen) & (doc_starts < (k + 1) * seqlen)]
        seg[k] = np.searchsorted(np.sort(starts), pos, side="right")
        seg[k][pos >= stream_len] = -1
    return seg


@pytest.mark.parametrize("tokenizer", ["tiktoken:r50k_base", str(NEOX_JSON)], ids=["pad-is-eot", "own-pad"])
def test_boundaries_match_the_input_documents(tmp_path: Path, tokenizer):
    docs = make_docs(60, seed=11)
    src = write_jsonl(tmp_path / "in.jsonl", docs)
    seqlen = 48
    stats = build(
        [src], tmp_path / "c", tokenizer=tokenizer, seqlen=seqlen, chunk_size=10_000, shuffle=False, tail="pad"
    )
    meta = stats.metadata
    assert (meta["pad_id"] == meta["eot_id"]) == tokenizer.startswith("tiktoken")
    tok = tokshuf.Tokenizer(tokenizer)
    lengths = np.array([len(tok.encode(d)) + 1 for d in docs])
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    stream_len = int(lengths.sum())

    reader = tokshuf.Reader(tmp_path / "c", batch_size=4, single_pass=True, boundaries="segment_ids", dtype="int64")
    batches = list(reader)
    ids = np.concatenate([b for b, _ in batches])
    seg = np.concatenate([s for _, s in batches])
    assert seg.dtype == np.int32
    np.testing.assert_array_equal(seg, expected(stream_len, doc_starts, len(ids), seqlen))

    # The other layouts say the same thing.
    pos = reader.boundaries_of(ids, "position_ids")
    cu, longest = reader.boundaries_of(ids, "cu_seqlens")
    flat_seg = np.where(seg >= 0, seg, 10_000) + 100_000 * np.arange(len(ids))[:, None]
    changes = np.flatnonzero(np.diff(flat_seg.ravel()) != 0) + 1
    np.testing.assert_array_equal(cu, np.concatenate([[0], changes, [ids.size]]))
    assert longest == np.diff(cu).max()
    for row_seg, row_pos in zip(seg, pos):
        for s in set(row_seg.tolist()) - {-1}:
            assert row_pos[row_seg == s].tolist() == list(range((row_seg == s).sum()))
        assert (row_pos[row_seg == -1] == 0).all()
    # Padding is exactly what the build recorded.
    assert int((seg == -1).sum()) == meta["num_padding_tokens"] > 0


def test_reader_rejects_unknown_layouts(tmp_path: Path):
    build([write_jsonl(tmp_path / "in.jsonl", make_docs(5))], tmp_path / "c", seqlen=16)
    with pytest.raises(tokshuf.ConfigError, match="boundaries"):
        tokshuf.Reader(tmp_path / "c", batch_size=2, boundaries="nope")
    # pairs() shifts plain batches; a (batch, boundaries) pair is the caller's to shift.
    r = tokshuf.Reader(tmp_path / "c", batch_size=2, boundaries="segment_ids")
    with pytest.raises(tokshuf.ConfigError, match="boundaries='segment_ids'"):
        next(r.pairs())
    with pytest.raises(tokshuf.ConfigError, match="boundaries"):
        tokshuf.shift_targets(next(r))
    inputs, targets = next(tokshuf.Reader(tmp_path / "c", batch_size=2).pairs())
    assert inputs.shape == targets.shape == (2, 15)
