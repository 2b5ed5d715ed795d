"""The build runs end to end and its counts add up."""

import json

import numpy as np

import tokshuf


def test_build_counts_add_up(small_corpus, tmp_path):
    out = tmp_path / "cache"
    stats = tokshuf.build_cache(small_corpus, out, seqlen=64, chunk_size=16, threads=2, progress=False)
    meta = json.loads((out / "tokshuf.json").read_text())
    assert meta["status"] == "complete"
    assert stats.num_documents == 95
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert sum(m["num_sequences"] for m in manifest) == stats.num_contexts == meta["num_contexts"]
    assert all(m["num_sequences"] == 16 for m in manifest[:-1])
    # Real tokens + padding fill the contexts exactly (stitch pads once per cache).
    assert stats.num_tokens + meta["num_padding_tokens"] == stats.num_contexts * 64
    assert meta["num_padding_tokens"] < 64
    assert not (out / ".tokshuf-work").exists()
    tok = tokshuf.Tokenizer(tokshuf.DEFAULT_TOKENIZER)
    assert tok.encode("Hello world") == [15496, 995]
    assert np.dtype(meta["dtype"]) == np.uint16
