"""Every code example of the docs site runs: each page's ```python blocks run in order in one
namespace, and its ```bash blocks in bash, in a folder holding the corpus and caches the pages
name (``data/{web,books,code}/``, ``cache/``, ``caches/{web,code,books}``). A block that cannot
run here says so just before it, with a reason:

    <!-- docs-test: skip (why) -->          never run (installs, clusters, network)
    <!-- docs-test: requires MODULE ... --> run only where the modules import

Other fenced blocks must be ``text`` (diagrams, formulas), so no example goes untested by
accident. Included files (``--8<--``) are the examples, run by test_examples.py."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import tokshuf

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SAMPLE = ROOT / "tests" / "data" / "sample"
RUNNABLE = {"python", "bash"}
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```$", re.M | re.S)
MARK = re.compile(r"<!-- docs-test: (skip \((?P<why>[^)]+)\)|requires (?P<mods>[\w. ]+)) -->\s*$")


@dataclass
class Block:
    page: str
    line: int
    lang: str
    code: str
    skip: Optional[str]
    requires: Tuple[str, ...]


def blocks(page: Path) -> List[Block]:
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        out.append(
            Block(
                page=page.name,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m[1],
                code=m[2],
                skip=mark["why"] if mark else None,
                requires=tuple(mark["mods"].split()) if mark and mark["mods"] else (),
            )
        )
    return out


PAGES = sorted(DOCS.glob("*.md"))


def test_every_block_is_runnable_or_says_why_not():
    bad = []
    for page in PAGES:
        for b in blocks(page):
            if b.lang not in RUNNABLE | {"text"}:
                bad.append(f"{b.page}:{b.line}: fence language {b.lang!r} (python, bash, or text for a non-example)")
            elif "--8<--" in b.code and b.skip is None:
                bad.append(f"{b.page}:{b.line}: an included file must be marked skip (with where it is tested)")
    assert not bad, "\n".join(bad)
    assert (
        sum(b.lang in RUNNABLE and b.skip is None for p in PAGES for b in blocks(p)) >= 25
    )  # the extractor finds them


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The corpus and caches the pages use, built once."""
    zstd = pytest.importorskip("zstandard")
    root = tmp_path_factory.mktemp("docs-world")
    for sub in ("web", "books", "code"):
        (root / "data" / sub).mkdir(parents=True)
    shutil.copy(SAMPLE / "kjv.jsonl", root / "data" / "web" / "kjv.jsonl")
    data = (SAMPLE / "wordnet.jsonl").read_bytes()
    (root / "data" / "books" / "wordnet.jsonl.zst").write_bytes(zstd.ZstdCompressor().compress(data))
    (root / "data" / "code" / "python-docs.jsonl.gz").write_bytes(
        gzip.compress((SAMPLE / "python-docs.jsonl").read_bytes(), mtime=0)
    )
    # Built as the pages spell them (relative paths), so a page's own build of `cache/` finds
    # this one complete with the same recipe.
    cwd = os.getcwd()
    os.chdir(root)
    try:
        tokshuf.build_cache("data/", "cache/", progress=False)
        for sub in ("web", "books", "code"):
            tokshuf.build_cache(f"data/{sub}", f"caches/{sub}", progress=False)
    finally:
        os.chdir(cwd)
    return root


# A page's blocks run in order in one fresh interpreter, as a reader would run them (and so that
# frameworks the pages import, JAX among them, never start inside the test process): python
# blocks share one namespace, bash blocks run in bash with this interpreter's scripts on PATH.
RUNNER = """
import json, subprocess, sys
namespace = {"__name__": "__docs__"}
for lang, where, code in json.load(sys.stdin):
    if lang == "python":
        exec(compile(code, where, "exec"), namespace)
        continue
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode:
        sys.exit(f"{where} exited {proc.returncode}:\\n{code}\\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
"""


@pytest.mark.parametrize("page", [p.name for p in PAGES if any(b.lang in RUNNABLE for b in blocks(p))])
def test_page_examples_run(page, world, tmp_path):
    here = tmp_path / "page"
    shutil.copytree(world, here, copy_function=os.link)  # pages write only new folders
    todo, missing = [], []
    for b in blocks(DOCS / page):
        if b.lang not in RUNNABLE or b.skip:
            continue
        absent = [m for m in b.requires if importlib.util.find_spec(m) is None]
        if absent:
            missing.append(f"line {b.line} needs {', '.join(absent)}")
        else:
            todo.append((b.lang, f"docs/{page}:{b.line}", b.code))
    scripts = sysconfig.get_path("scripts")
    env = {**os.environ, "PATH": os.pathsep.join([scripts, str(Path(sys.executable).parent), os.environ["PATH"]])}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(todo),
        cwd=here,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    if missing:
        pytest.skip(f"{page}: the other blocks ran; {'; '.join(missing)}")
