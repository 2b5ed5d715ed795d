"""Property tests: corrupted inputs and caches never crash or hang the process.

- The JSON-line parser agrees with a pure-Python reference (``json.loads`` plus the rules
  tokshuf documents) on valid, mutated and random lines: this is also the short CI fuzz run of
  the parser (``HYPOTHESIS_PROFILE=dev`` for a longer one).
- Random flips, truncations, insertions and deletions of small .jsonl/.gz/.zst inputs give
  only typed errors (``errors="raise"``) or skip counts (``errors="skip"``); for plain jsonl the
  counts, the error location and the cache contents are predicted exactly.
- ``verify`` on randomly damaged caches returns a report (never raises) and, with ``full``,
  catches every change to a shard.

Builds run in-process: a Rust panic would surface as pyo3's PanicException (or a RuntimeError
from the worker thread), which these tests reject. A hang trips faulthandler's timer, which ends
the run instead of blocking CI, leaving the example and the stacks in tokshuf-hang-PID.log in
the temp folder (pytest captures stderr, so they cannot go there).
"""

from __future__ import annotations

import faulthandler
import gzip
import io
import json
import math
import os
import re
import shutil
import tempfile
import zlib
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import tokshuf
import zstandard
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from support.build import build
from support.cache import assert_cache_holds
from tokshuf._core import parse_line

HANG_SECONDS = 120  # per parse, build or verify; the slowest take well under a second
# Scaled from the loaded profile: the parser is cheap, a build costs ~0.1 s.
PARSER_EXAMPLES = settings().max_examples * 12
BUILD_EXAMPLES = settings().max_examples
BOM = b"\xef\xbb\xbf"
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]|\\u[dD][c-fC-F]")


HANG_LOG = Path(tempfile.gettempdir()) / f"tokshuf-hang-{os.getpid()}.log"


@contextmanager
def hang_guard(example: object):
    """Exit the process (failing CI) if the body takes more than HANG_SECONDS."""
    with open(HANG_LOG, "w") as log:
        log.write(f"example: {example!r}\n")
        log.flush()
        faulthandler.dump_traceback_later(HANG_SECONDS, exit=True, file=log)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()


@pytest.fixture(scope="module")
def tok():
    return tokshuf.Tokenizer(tokshuf.DEFAULT_TOKENIZER)


# ------------------------------------------------------------------------------------------------
# Reference line parser


class _Num(str):
    """A number kept as its text, so the reference can tell which ones serde_json rejects."""


def _finite(s: str) -> bool:
    return math.isfinite(float(s))


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def ref_parse(line: bytes, key: str = "text") -> Tuple[set, Optional[str]]:
    """(acceptable kinds, text) for one line without its newline, as tokshuf documents it."""
    if line.endswith(b"\r"):
        line = line[:-1]
    if all(b in b" \t\n\x0c\r" for b in line):
        return {"blank"}, None
    try:
        s = line.decode("utf-8")
    except UnicodeDecodeError:
        return {"invalid_utf8"}, None
    top_pairs: List[list] = []

    def hook(pairs):
        top_pairs[:] = [pairs]  # objects close inside-out: the last call is the outermost one
        return dict(pairs)

    try:
        value = json.loads(s, object_pairs_hook=hook, parse_float=_Num, parse_int=_Num, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        # serde_json stops at the first problem in reading order; a lone surrogate escape met
        # before the syntax error is reported as invalid_utf8.
        return ({"invalid_json", "invalid_utf8"} if SURROGATE_ESCAPE.search(line) else {"invalid_json"}), None
    if isinstance(value, _Num):
        return ({"not_an_object"} if _finite(value) else {"invalid_json"}), None
    if isinstance(value, str) and any("\ud800" <= c <= "\udfff" for c in value):
        return {"invalid_utf8"}, None  # a bare string is decoded like the text value
    if not isinstance(value, dict):
        return {"not_an_object"}, None
    found: Tuple[set, Optional[str]] = ({"missing_text"}, None)
    for k, v in top_pairs[0]:
        if any("\ud800" <= c <= "\udfff" for c in k):
            return {"invalid_utf8"}, None  # keys of the line's object are read as text
        if k != key:
            continue  # other values are skipped unread (out-of-range numbers, lone surrogates)
        if isinstance(v, _Num):
            if not _finite(v):
                return {"invalid_json"}, None
            found = ({"text_not_string"}, None)
        elif isinstance(v, str):
            if any("\ud800" <= c <= "\udfff" for c in v):
                return {"invalid_utf8"}, None
            found = ({"text"}, v)
        elif isinstance(v, dict) and any("\ud800" <= c <= "\udfff" for k2 in v for c in k2):
            return {"invalid_utf8"}, None  # serde_json decodes the keys of a map it walks
        else:
            found = ({"text_not_string"}, None)
    return found


def check_line(line: bytes) -> Tuple[str, Optional[str]]:
    with hang_guard(line):
        kind, value = parse_line(line, "text")
    want, text = ref_parse(line)
    assert kind in want, (line, kind, value, want)
    if kind == "text":
        assert value == text, (line, value, text)
    return kind, value


json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=12
)
SPECIAL = [
    b"\n",
    b"\r",
    b"\x00",
    BOM,
    b'"',
    b"\\",
    b"\\ud800",
    b"\\udc00",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\xff",
    b"\xc3",
    b"1e999",
    b"-",
    b".",
    b"e",
    b'"text"',
    b"null",
    b"NaN",
    b" ",
    b"\x0c",
    b"\xed\xa0\x80",
]


@st.composite
def json_lines(draw) -> bytes:
    obj = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
    if draw(st.booleans()):
        obj["text"] = draw(st.one_of(st.text(max_size=30), json_values))
    items = list(obj.items())
    if draw(st.booleans()) and items:  # a duplicate key, as real dumps sometimes have
        items.append(("text", draw(json_values)))
    ascii_only = draw(st.booleans())
    body = (
        "{"
        + ", ".join(
            f"{json.dumps(k, ensure_ascii=ascii_only)}: {json.dumps(v, ensure_ascii=ascii_only)}" for k, v in items
        )
        + "}"
    )
    if draw(st.integers(0, 9)) == 0:
        body = json.dumps(draw(json_values))
    return body.encode()


@st.composite
def mutated(draw, data: bytes, max_ops: int = 4) -> bytes:
    """Flip bits, truncate, insert (random or JSON-significant bytes), delete or zero a range."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, max_ops))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "special", "delete", "zero"]))
        pos = draw(st.integers(0, len(out)))
        if op == "flip" and out:
            out[min(pos, len(out) - 1)] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del out[pos:]
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif op == "special":
            out[pos:pos] = draw(st.sampled_from(SPECIAL))
        elif op == "delete":
            del out[pos : pos + draw(st.integers(1, 16))]
        elif op == "zero":
            n = draw(st.integers(1, 16))
            out[pos : pos + n] = bytes(len(out[pos : pos + n]))
    return bytes(out)


@given(json_lines())
@example(b'{"text": "a", "text": "\\ud800"}')
@example(b'{"\\udc00": 1, "text": "a"}')
@example(b'{"text": 1e999}')
@example(b'"\\udc00"')
@example(b'{"text": {"\\ud800]": null}}')
@example(b'{"x": 1e999, "text": "ok"}')
@example(b"1" * 400)
@example(b'{"text": "a"}\r\r')
@example(b"\x0c\x0c")
@settings(max_examples=PARSER_EXAMPLES)
def test_parser_matches_reference_on_valid_lines(line):
    check_line(line)


@given(st.data())
@settings(max_examples=PARSER_EXAMPLES)
def test_parser_matches_reference_on_mutated_lines(data):
    line = data.draw(json_lines())
    check_line(data.draw(mutated(line)).replace(b"\n", b" "))


@given(st.binary(max_size=64))
@settings(max_examples=PARSER_EXAMPLES)
def test_parser_matches_reference_on_random_bytes(line):
    check_line(line.replace(b"\n", b""))


# ------------------------------------------------------------------------------------------------
# Whole builds on corrupted files


def ref_file(data: bytes) -> Tuple[List[str], Counter, int, int, Optional[int], bool]:
    """(documents, skipped by reason, blank lines, empty documents, first bad line, ambiguous)
    of a plain jsonl; ambiguous when a line's reason depends on serde_json's reading order."""
    if data.startswith(BOM):
        data = data[3:]
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    docs, skipped, blank, empty, first_bad, ambiguous = [], Counter(), 0, 0, None, False
    for n, line in enumerate(lines, 1):
        kinds, text = ref_parse(line)
        ambiguous |= len(kinds) > 1
        kind = min(kinds)
        if kind == "blank":
            blank += 1
        elif kind == "text":
            if text:
                docs.append(text)
            else:
                empty += 1
        else:
            skipped[kind] += 1
            first_bad = first_bad or n
    return docs, skipped, blank, empty, first_bad, ambiguous


def run_build(src: Path, out: Path, errors: str):
    """The build's stats, or its exception if it is a TokshufError; anything else fails the test."""
    try:
        with hang_guard((src.read_bytes(), errors)):
            return build([src], out, seqlen=16, chunk_size=100_000, shuffle=False, threads=2, errors=errors)
    except tokshuf.TokshufError as e:
        return e
    except BaseException as e:  # PanicException derives from BaseException
        pytest.fail(f"untyped failure {type(e).__module__}.{type(e).__name__}: {e}")


docs_strategy = st.lists(st.text(max_size=40), min_size=1, max_size=8)


def encode_docs(docs: List[str], ascii_only: bool) -> bytes:
    return "".join(json.dumps({"text": d}, ensure_ascii=ascii_only) + "\n" for d in docs).encode()


@given(docs=docs_strategy, ascii_only=st.booleans(), data=st.data())
@settings(max_examples=BUILD_EXAMPLES)
def test_corrupted_jsonl_exact(tok, docs, ascii_only, data):
    raw = data.draw(mutated(encode_docs(docs, ascii_only)))
    want_docs, want_skipped, blank, empty, first_bad, ambiguous = ref_file(raw)
    assume(not ambiguous)  # such lines are covered by the parser tests above
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "in.jsonl"
        src.write_bytes(raw)
        got = run_build(src, Path(d) / "raise", "raise")
        if first_bad is not None:
            assert isinstance(got, tokshuf.InputError) and f"{src}:{first_bad}:" in str(got), got
        else:
            assert isinstance(got, tokshuf.BuildStats), got
        got = run_build(src, Path(d) / "skip", "skip")
        assert isinstance(got, tokshuf.BuildStats), got  # possibly an empty cache
        meta = got.metadata
        assert meta["skipped"] == dict(want_skipped)
        assert (meta["blank_lines"], meta["empty_documents"]) == (blank, empty)
        assert_cache_holds(Path(d) / "skip", [want_docs], tok)


def python_decompress(suffix: str, raw: bytes) -> Optional[bytes]:
    """What Python's own decoders make of the file, or None if they reject it."""
    if not raw:
        return b""
    try:
        if suffix == ".gz":
            return gzip.decompress(raw)
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True) as r:
            return r.read()
    except (OSError, EOFError, zlib.error, zstandard.ZstdError):
        return None


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@given(docs=docs_strategy, data=st.data())
@settings(max_examples=BUILD_EXAMPLES)
def test_corrupted_compressed_inputs_give_typed_outcomes(tok, suffix, docs, data):
    payload = encode_docs(docs, True)
    split = data.draw(st.integers(0, len(payload)))  # two members/frames, as real files often have
    parts = [payload[:split], payload[split:]]
    if suffix == ".gz":
        clean = b"".join(gzip.compress(p, mtime=0) for p in parts)
    else:
        checksum = data.draw(st.booleans())
        clean = b"".join(zstandard.ZstdCompressor(write_checksum=checksum).compress(p) for p in parts)
    raw = data.draw(mutated(clean))
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / f"in.jsonl{suffix}"
        src.write_bytes(raw)
        strict = run_build(src, Path(d) / "raise", "raise")
        if isinstance(strict, tokshuf.TokshufError):
            assert isinstance(strict, tokshuf.InputError) and f"{src}:" in str(strict), strict
        else:
            # Accepted as a whole: Python's decoders must agree on every byte of it.
            plain = python_decompress(suffix, raw)
            assert plain is not None, "tokshuf accepted a stream Python's decoder rejects"
            want_docs, skipped, _, _, first_bad, _ = ref_file(plain)
            assert first_bad is None and not skipped
            assert_cache_holds(Path(d) / "raise", [want_docs], tok)
        lenient = run_build(src, Path(d) / "skip", "skip")
        assert isinstance(lenient, tokshuf.BuildStats), lenient
        assert lenient.metadata["skipped"].get("corrupt_stream", 0) <= 1
        report = tokshuf.verify(Path(d) / "skip", full=True)
        assert report.ok, report.summary()


# ------------------------------------------------------------------------------------------------
# verify on damaged caches


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    src = root / "a.jsonl"
    src.write_bytes(encode_docs([f"document number {i} " * (i % 7 + 1) for i in range(60)], True))
    caches = {}
    for fmt in ("npy", "json.gz"):
        tokshuf.build_cache([src], root / fmt, seqlen=32, chunk_size=8, threads=1, progress=False, format=fmt)
        caches[fmt] = root / fmt
    return caches


@pytest.mark.parametrize("fmt", ["npy", "json.gz"])
@given(data=st.data())
@settings(max_examples=BUILD_EXAMPLES)
def test_verify_survives_and_catches_damage(pristine, fmt, data):
    src = pristine[fmt]
    names = sorted(p.name for p in src.iterdir())
    name = data.draw(st.sampled_from(names))
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d) / "c"
        shutil.copytree(src, cache)
        target = cache / name
        before = target.read_bytes()
        after = data.draw(mutated(before, max_ops=3))
        target.write_bytes(after)
        full = data.draw(st.booleans())
        try:
            with hang_guard((name, after)):
                report = tokshuf.verify(cache, full=full)
                report.summary()
        except BaseException as e:
            pytest.fail(f"verify raised {type(e).__name__}: {e}")
        if name.endswith(".tar") and after != before:
            assert not tokshuf.verify(cache, full=True).ok
