"""Best-fit packing (docs/format.md, packing): the built contexts equal a pure-Python reference of
best-fit decreasing, no document that fits a context is ever split, and the figures in
tokshuf.json say what the packing did and what concat would have done."""

from __future__ import annotations

import itertools
import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import List

import numpy as np
import pytest
import tokshuf
from hypothesis import given
from hypothesis import strategies as st
from support.build import build
from support.cache import read_contexts
from support.corpus import make_docs, write_jsonl

SPEC = "tiktoken:r50k_base"
EOT = 50256


def reference_bestfit(docs: List[List[int]], seqlen: int, window: int, pad: int) -> List[List[int]]:
    """docs/format.md, packing, written out plainly: per window, pieces longest first (ties by
    position), each into the context with the least room that fits it, else a new one."""
    out: List[List[int]] = []
    for w in range(0, len(docs), window):
        pieces = []
        for d in docs[w : w + window]:
            cuts = list(range(0, len(d), seqlen))
            pieces += [d[c : c + seqlen] for c in cuts]
        order = sorted(range(len(pieces)), key=lambda i: (-len(pieces[i]), i))
        contexts: List[List[int]] = []
        for i in order:
            p = pieces[i]
            fits = [k for k, c in enumerate(contexts) if seqlen - len(c) >= len(p)]
            if fits:
                k = min(fits, key=lambda k: (seqlen - len(contexts[k]), k))
                contexts[k] += p
            else:
                contexts.append(list(p))
        out += [c + [pad] * (seqlen - len(c)) for c in contexts]
    return out


def documents(texts: List[str]) -> List[List[int]]:
    tok = tokshuf.Tokenizer(SPEC)
    return [[*tok.encode(t), EOT] for t in texts if t]


def test_reference_never_splits_a_document_that_fits():
    docs = [[k + 1] * n for k, n in enumerate((5, 17, 3, 32, 40, 8, 9, 31))]
    ctxs = reference_bestfit(docs, 32, 100, 0)
    # Pieces 32, 32 (of the 40), 31, 17, 9, 8 (the 40's rest), 8, 5, 3, each into the tightest fit.
    runs = [[(v, sum(1 for _ in g)) for v, g in itertools.groupby(c) if v] for c in ctxs]
    assert runs == [[(4, 32)], [(5, 32)], [(8, 31)], [(2, 17), (7, 9), (1, 5)], [(5, 8), (6, 8), (3, 3)]]


@pytest.mark.parametrize("window", [1, 7, 1024])
def test_build_equals_reference(tmp_path: Path, window):
    texts = make_docs(80, seed=4)
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    stats = build(
        [src],
        tmp_path / "c",
        tokenizer=SPEC,
        seqlen=64,
        chunk_size=10**6,
        shuffle=False,
        packing="bestfit",
        pack_window=window,
    )
    docs = documents(texts)
    want = reference_bestfit(docs, 64, window, EOT)
    assert read_contexts(tmp_path / "c") == want
    meta = stats.metadata
    assert meta["packing"] == "bestfit" and meta["recipe"]["packing"] == "bestfit"
    assert meta["recipe"]["pack_window"] == window
    figures = meta["packing_stats"]
    assert figures["documents_split"] == sum(len(d) > 64 for d in docs)
    padding = sum(c.count(EOT) for c in want) - len(docs)  # every document ends in one EOT
    assert meta["num_padding_tokens"] == padding
    assert figures["padding_fraction"] == pytest.approx(padding / (len(want) * 64))
    starts = np.cumsum([0] + [len(d) for d in docs])
    assert figures["concat_documents_split"] == sum(s // 64 != (e - 1) // 64 for s, e in zip(starts, starts[1:]))
    assert meta["num_tokens"] == sum(len(d) for d in docs)


WORDS = st.sampled_from(["alpha", " beta", " gamma", ".", "\n", " 7", " épsilon"])


@given(
    texts=st.lists(st.lists(WORDS, min_size=1, max_size=30).map("".join), min_size=1, max_size=25),
    seqlen=st.integers(2, 24),
    window=st.integers(1, 9),
)
def test_no_document_that_fits_is_split(texts, seqlen, window):
    with tempfile.TemporaryDirectory() as tmp:
        src = write_jsonl(Path(tmp) / "in.jsonl", texts)
        build(
            [src],
            Path(tmp) / "c",
            tokenizer=SPEC,
            seqlen=seqlen,
            chunk_size=10**6,
            shuffle=False,
            packing="bestfit",
            pack_window=window,
        )
        got = read_contexts(Path(tmp) / "c")
    docs = documents(texts)
    assert got == reference_bestfit(docs, seqlen, window, EOT)
    flat = [tuple(c) for c in got]
    for d in docs:
        if len(d) <= seqlen:  # whole, inside one context
            assert any(tuple(d) == c[i : i + len(d)] for c in flat for i in range(seqlen - len(d) + 1))


def test_shuffled_bestfit_holds_the_same_contexts(tmp_path: Path):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(60, seed=9))
    opts = dict(tokenizer=SPEC, seqlen=64, chunk_size=7, packing="bestfit", pack_window=16)
    build([src], tmp_path / "stream", shuffle=False, **opts)
    build([src], tmp_path / "shuf", num_local_cells=3, seed=5, **opts)
    a, b = read_contexts(tmp_path / "stream"), read_contexts(tmp_path / "shuf")
    assert a != b and Counter(map(tuple, a)) == Counter(map(tuple, b))


@pytest.mark.parametrize("packing", ["bestfit", "none"])
def test_a_tail_policy_that_does_not_apply_is_not_part_of_the_recipe(tmp_path: Path, packing):
    # Best fit and unpacked builds have no tail: a tail given anyway shaped nothing, so it is
    # recorded as the default, and a rerun that differs only in it is the same build.
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(30))
    first = build([src], tmp_path / "c", tokenizer=SPEC, seqlen=64, chunk_size=8, packing=packing, tail="pad")
    assert first.metadata["recipe"]["tail"] == "stitch"
    again = build([src], tmp_path / "c", tokenizer=SPEC, seqlen=64, chunk_size=8, packing=packing, tail="drop")
    assert again.metadata == first.metadata


def test_packing_options_are_checked(tmp_path: Path):
    src = write_jsonl(tmp_path / "in.jsonl", make_docs(3))
    with pytest.raises(tokshuf.ConfigError, match="pack_window is an option of"):
        build([src], tmp_path / "a", pack_window=8)
    with pytest.raises(tokshuf.ConfigError, match="pack_window must be positive"):
        build([src], tmp_path / "b", packing="bestfit", pack_window=0)
    with pytest.raises(tokshuf.ConfigError, match="packing="):
        build([src], tmp_path / "c", packing="tight")


def test_streamed_chunks_count_only_real_tokens(tmp_path: Path):
    # Enough text for stage 1 to take the file in several batches, so most chunks are written
    # while the file is still being read, before its summary exists.
    texts = make_docs(400, seed=11)
    src = write_jsonl(tmp_path / "in.jsonl", texts)
    seqlen, cs = 64, 7
    stats = build(
        [src],
        tmp_path / "c",
        tokenizer=SPEC,
        seqlen=seqlen,
        chunk_size=cs,
        shuffle=False,
        packing="bestfit",
        pack_window=16,
    )
    want = reference_bestfit(documents(texts), seqlen, 16, -1)  # -1 marks padding
    real = [seqlen - c.count(-1) for c in want]
    lines = [json.loads(line) for line in (tmp_path / "c" / "manifest.jsonl").read_text().splitlines()]
    assert len(lines) > 20
    assert [line["num_tokens"] for line in lines] == [sum(real[k : k + cs]) for k in range(0, len(real), cs)]
    assert sum(real) == stats.metadata["num_tokens"]
    assert tokshuf.verify(tmp_path / "c").ok
