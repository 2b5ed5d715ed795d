"""Regenerate tests/data/sample/ from the benchmark corpus (see README.md here).

    python tests/data/make_sample.py $TOKSHUF_CORPUS/jsonl

Picks documents of three public-domain or permissively licensed sources, in id order, up to a
byte budget per source, and writes them as plain jsonl (text, id, source). Deterministic.
"""

from __future__ import annotations

import glob
import json
import os
import sys

# source -> (output file, text-byte budget, documents to include first if present)
PLAN = {
    "kjv-bible": ("kjv.jsonl", 420_000, []),
    "python-docs": (
        "python-docs.jsonl",
        1_120_000,
        ["python-docs/howto/unicode.rst.txt", "python-docs/library/random.rst.txt"],
    ),
    "wordnet": ("wordnet.jsonl", 330_000, []),
}
MAX_DOC = 80_000


def main(corpus: str, out: str) -> None:
    docs = {s: [] for s in PLAN}
    for path in sorted(glob.glob(os.path.join(corpus, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                if d.get("source") in docs:
                    docs[d["source"]].append(d)
    os.makedirs(out, exist_ok=True)
    for source, (name, budget, first) in PLAN.items():
        pool = sorted(docs[source], key=lambda d: (d["id"] not in first, d["id"]))
        chosen, used = [], 0
        for d in pool:
            n = len(d["text"].encode())
            if n > MAX_DOC or used + n > budget:
                continue
            chosen.append(d)
            used += n
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            for d in chosen:
                f.write(json.dumps({"text": d["text"], "id": d["id"], "source": source}, ensure_ascii=False) + "\n")
        print(f"{name}: {len(chosen)} documents, {used:,} bytes of text")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "sample"))
