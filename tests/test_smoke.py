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


def test_building_never_loads_numpy(small_corpus, tmp_path):
    """NumPy starts OpenBLAS's spinning thread pool on import: `import tokshuf`, build_cache and
    the build CLI must not load it; the reading side still imports it on first use."""
    import subprocess
    import sys

    inputs = [str(p) for p in small_corpus]
    code = f"""
import sys
import tokshuf
from tokshuf.__main__ import main
tokshuf.build_cache({inputs!r}, {str(tmp_path / "a")!r}, seqlen=64, progress=False)
assert main(["build", "--input", {inputs[0]!r}, "--output", {str(tmp_path / "b")!r}, "--seqlen", "64", "--no-progress"]) == 0
assert "numpy" not in sys.modules, "numpy was imported"
assert len(tokshuf.Cache({str(tmp_path / "a")!r})) > 0 and "numpy" in sys.modules
assert {{"Reader", "Blend", "verify"}} <= set(dir(tokshuf))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cli_blend_quantum_default_is_the_library_default():
    from tokshuf import _blend, _cli_blend

    assert _cli_blend.DEFAULT_QUANTUM == _blend.DEFAULT_QUANTUM
