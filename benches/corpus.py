"""Where the benchmarks find the corpus: under the folder named by ``$TOKSHUF_CORPUS`` (what
``../shared/corpus/make_corpus.py --out DIR`` wrote), else the small sample committed in
``tests/data/sample``, so that every bench runs anywhere."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "data" / "sample"
ENV = "TOKSHUF_CORPUS"


def corpus(*parts: str) -> Path:
    """``$TOKSHUF_CORPUS/PARTS``, or the committed sample when the variable is not set."""
    root = os.environ.get(ENV)
    return Path(root, *parts) if root else SAMPLE
