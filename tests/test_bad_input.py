"""Hostile and broken input (DESIGN §8, issue 7): one test per case.

Every case checks the exception class (and its built-in base), the location in the message,
and under ``errors="skip"`` the exact counts in tokshuf.json and that every other document is
in the cache, in order, token for token. Caches are built with ``shuffle=False`` and one chunk
per input file, so the expected chunks follow from the documents alone (see ``expected_chunks``).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import pytest
import tokshuf
import zstandard
from support.build import build as run_build
from support.cache import assert_cache_holds, chunk_ids
from support.corpus import make_docs, write_jsonl

SEQLEN = 64
BIG_CHUNK = 1_000_000  # one chunk per input file: chunk order = file order


@pytest.fixture(scope="module")
def tok() -> tokshuf.Tokenizer:
    return tokshuf.Tokenizer(tokshuf.DEFAULT_TOKENIZER)


build = functools.partial(run_build, seqlen=SEQLEN, chunk_size=BIG_CHUNK, shuffle=False, threads=2)


def jsonl_bytes(docs: Sequence[str]) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


def assert_located(err: BaseException, path: Path, line: Optional[int], *fragments: str) -> None:
    msg = str(err)
    where = f"{path}:{line}:" if line is not None else str(path)
    assert where in msg, msg
    for f in fragments:
        assert f in msg, msg


GOOD = make_docs(12, seed=5)

# (id, bad line bytes, skip reason, message fragment)
BAD_LINES = [
    ("invalid-json", b'{"text": "a"', "invalid_json", "invalid JSON"),
    ("trailing-garbage", b'{"text": "a"} x', "invalid_json", "trailing characters"),
    ("not-json-at-all", b"hello world", "invalid_json", "invalid JSON"),
    ("nan-constant", b'{"text": "a", "score": NaN}', "invalid_json", "invalid JSON"),
    ("list", b'["text", "a"]', "not_an_object", "a JSON list, not an object"),
    ("string", b'"just text"', "not_an_object", "a JSON string, not an object"),
    ("number", b"42", "not_an_object", "a JSON number, not an object"),
    ("null", b"null", "not_an_object", "a JSON null, not an object"),
    ("bool", b"true", "not_an_object", "a JSON boolean, not an object"),
    ("missing-text", b'{"content": "a"}', "missing_text", 'no "text" key'),
    ("text-number", b'{"text": 12}', "text_not_string", '"text" is a number'),
    ("text-float", b'{"text": 1.5e3}', "text_not_string", '"text" is a number'),
    ("text-null", b'{"text": null}', "text_not_string", '"text" is null'),
    ("text-list", b'{"text": ["a", "b"]}', "text_not_string", '"text" is a list'),
    ("text-object", b'{"text": {"a": "b"}}', "text_not_string", '"text" is an object'),
    ("text-bool", b'{"text": false}', "text_not_string", '"text" is a boolean'),
    ("invalid-utf8-in-text", b'{"text": "caf\xe9"}', "invalid_utf8", "invalid UTF-8 at byte 13"),
    ("invalid-utf8-elsewhere", b'{"id": "\xff\xfe", "text": "fine"}', "invalid_utf8", "invalid UTF-8 at byte 8"),
    ("overlong-utf8", b'{"text": "\xc0\xaf"}', "invalid_utf8", "invalid UTF-8"),
    ("utf16-line", '{"text": "a"}'.encode("utf-16"), "invalid_utf8", "invalid UTF-8 at byte 0"),
    ("lone-high-surrogate", b'{"text": "a\\ud800"}', "invalid_utf8", "lone surrogate"),
    ("lone-low-surrogate", b'{"text": "\\udc00b"}', "invalid_utf8", "lone surrogate"),
    ("reversed-surrogates", b'{"text": "\\ude00\\ud83d"}', "invalid_utf8", "lone surrogate"),
    ("raw-nul-in-string", b'{"text": "a\x00b"}', "invalid_json", "control character"),
    ("nul-bytes-only", b"\x00\x00\x00\x00", "invalid_json", "invalid JSON"),
    ("raw-control-char", b'{"text": "a\x01b"}', "invalid_json", "control character"),
    ("deep-nesting-not-object", b"[" * 100_000 + b"]" * 100_000, "not_an_object", "a JSON list"),
    ("deep-nesting-unclosed", b'{"text": "a", "x": ' + b"[" * 100_000, "invalid_json", "invalid JSON"),
    ("mid-file-bom", b'\xef\xbb\xbf{"text": "a"}', "invalid_json", "byte-order mark"),
]


def file_with_bad_lines(path: Path, bad: bytes) -> Path:
    """GOOD docs with the bad line as lines 2 and 9 (1-based)."""
    lines = [json.dumps({"text": d}).encode() for d in GOOD]
    lines.insert(1, bad)
    lines.insert(8, bad)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("case", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_raises_with_location(tmp_path, case):
    _, bad, _reason, fragment = case
    src = file_with_bad_lines(tmp_path / "in" / "bad.jsonl", bad)
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, tokshuf.TokshufError)
    assert_located(ei.value, src, 2, fragment)


@pytest.mark.parametrize("case", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_line_skipped_and_counted(tmp_path, tok, case):
    _, bad, reason, fragment = case
    src = file_with_bad_lines(tmp_path / "in" / "bad.jsonl", bad)
    stats = build([src], tmp_path / "out", errors="skip")
    meta = stats.metadata
    assert meta["skipped"] == {reason: 2}
    examples = meta["skipped_examples"][reason]
    # Named as tokshuf.json names inputs: relative to their common folder.
    assert [e.split(": ", 1)[0] for e in examples] == ["bad.jsonl:2", "bad.jsonl:9"]
    assert all(fragment in e for e in examples)
    assert "bad.jsonl:2:" in stats.summary()
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_skip_counts_add_up_over_reasons_and_files(tmp_path, tok):
    a = tmp_path / "in" / "a.jsonl"
    a.parent.mkdir()
    a.write_bytes(b'{"text": "one"}\n{"text": 1}\n{"x": 2}\n{bad\n\n{"text": "two"}\n' + b'{"text": "\xff"}\n' * 7)
    b = write_jsonl(tmp_path / "in" / "b.jsonl.gz", ["three"])
    with open(b, "ab") as f:  # a second gzip member holding bad lines
        f.write(gzip.compress(b'{"text": null}\n[]\n{"text": "four"}\n', mtime=0))
    stats = build([a, b], tmp_path / "out", errors="skip")
    meta = stats.metadata
    assert meta["skipped"] == {
        "text_not_string": 2,
        "missing_text": 1,
        "invalid_json": 1,
        "invalid_utf8": 7,
        "not_an_object": 1,
    }
    # At most five examples per reason, in file and line order.
    assert [e.split(": ", 1)[0] for e in meta["skipped_examples"]["invalid_utf8"]] == [
        f"a.jsonl:{n}" for n in range(7, 12)
    ]
    assert [e.split(": ", 1)[0] for e in meta["skipped_examples"]["text_not_string"]] == ["a.jsonl:2", "b.jsonl.gz:2"]
    assert meta["blank_lines"] == 1
    assert_cache_holds(tmp_path / "out", [["one", "two"], ["three", "four"]], tok)


# ---------------------------------------------------------------------------------------------
# Lines that look odd but are fine


def test_utf8_bom_at_file_start_is_ignored(tmp_path, tok):
    for name, compress in [
        ("a.jsonl", bytes),
        ("b.jsonl.gz", lambda b: gzip.compress(b, mtime=0)),
        ("c.jsonl.zst", zstandard.ZstdCompressor().compress),
    ]:
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(compress(b"\xef\xbb\xbf" + jsonl_bytes(GOOD)))
    files = sorted((tmp_path / "in").iterdir())
    stats = build(files, tmp_path / "out")
    assert stats.metadata["skipped"] == {}
    assert_cache_holds(tmp_path / "out", [GOOD] * 3, tok)


def test_crlf_line_endings(tmp_path, tok):
    src = tmp_path / "crlf.jsonl"
    src.write_bytes(jsonl_bytes(GOOD).replace(b"\n", b"\r\n"))
    stats = build([src], tmp_path / "out")
    assert stats.metadata["skipped"] == {} and stats.metadata["blank_lines"] == 0
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_text_with_escaped_crlf_keeps_it(tmp_path, tok):
    docs = ["line one\r\nline two", "a\rb"]
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    build([src], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [docs], tok)


def test_blank_lines_are_counted_not_errors(tmp_path, tok):
    src = tmp_path / "blank.jsonl"
    body = b"\n\n" + jsonl_bytes(GOOD[:3]) + b"   \n\t\n\r\n" + jsonl_bytes(GOOD[3:]) + b"\n"
    src.write_bytes(body)
    stats = build([src], tmp_path / "out")
    assert stats.metadata["blank_lines"] == 6
    assert stats.metadata["skipped"] == {}
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_empty_documents_are_counted(tmp_path, tok):
    src = write_jsonl(tmp_path / "a.jsonl", ["x", "", "y", ""])
    stats = build([src], tmp_path / "out")
    assert stats.metadata["empty_documents"] == 2 and stats.num_documents == 2
    assert_cache_holds(tmp_path / "out", [["x", "y"]], tok)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_last_line_without_newline(tmp_path, tok, suffix):
    payload = jsonl_bytes(GOOD).rstrip(b"\n")
    if suffix == ".jsonl.gz":
        payload = gzip.compress(payload, mtime=0)
    elif suffix == ".jsonl.zst":
        payload = zstandard.ZstdCompressor().compress(payload)
    src = tmp_path / f"a{suffix}"
    src.write_bytes(payload)
    build([src], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_escaped_nul_is_text(tmp_path, tok):
    docs = ["before\u0000after", "\u0000"]
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    build([src], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [docs], tok)


def test_duplicate_text_keys_last_wins_like_json_module(tmp_path, tok):
    line = '{"text": "first", "id": 3, "text": "second"}'
    assert json.loads(line)["text"] == "second"
    src = tmp_path / "dup.jsonl"
    src.write_text(line + "\n")
    stats = build([src], tmp_path / "out")
    assert stats.num_documents == 1
    assert_cache_holds(tmp_path / "out", [["second"]], tok)
    # A later non-string duplicate makes the line bad, as json.loads would see it.
    src.write_text('{"text": "first", "text": 7}\n' + line + "\n")
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out2")
    assert_located(ei.value, src, 1, '"text" is a number')


def test_deeply_nested_values_beside_the_text(tmp_path, tok):
    deep_list = "[" * 50_000 + "]" * 50_000
    deep_obj = '{"a": ' * 20_000 + "1" + "}" * 20_000
    src = tmp_path / "deep.jsonl"
    src.write_text(f'{{"meta": {deep_list}, "text": "kept", "m2": {deep_obj}}}\n')
    build([src], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [["kept"]], tok)


def test_other_text_key(tmp_path, tok):
    src = tmp_path / "a.jsonl"
    src.write_text('{"content": "one", "text": 5}\n{"content": "two"}\n')
    build([src], tmp_path / "out", text_key="content")
    assert_cache_holds(tmp_path / "out", [["one", "two"]], tok)


# ---------------------------------------------------------------------------------------------
# Long lines and long runs


def test_line_of_one_million_repeated_characters(tmp_path, tok):
    docs = ["a" * 1_000_000, "." * 1_000_000, "7" * 1_000_000]
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    build([src], tmp_path / "out", seqlen=2048)
    meta = json.loads((tmp_path / "out" / "tokshuf.json").read_text())
    assert meta["num_documents"] == 3
    got = np.concatenate(chunk_ids(tmp_path / "out"))
    want = np.concatenate([np.array(tok.encode(d) + [meta["eot_id"]]) for d in docs])
    np.testing.assert_array_equal(got[: len(want)], want)
    assert (got[len(want) :] == meta["pad_id"]).all()


@pytest.mark.parametrize(
    "run", [" ", "\n", "\t", " \n", "\u3000"], ids=["space", "newline", "tab", "space-nl", "ideographic"]
)
def test_million_char_whitespace_runs(tmp_path, tok, run):
    """fancy-regex gives up on ~1M-character runs (Python tiktoken panics there); the build must
    still give the ids the tokenizer's pattern defines."""
    n = 1_000_000 // len(run)
    docs = ["x" + run * n + "b", run * n, "start" + run * n]
    src = write_jsonl(tmp_path / "ws.jsonl", docs)
    build([src], tmp_path / "out", seqlen=1024)
    meta = json.loads((tmp_path / "out" / "tokshuf.json").read_text())
    got = np.concatenate(chunk_ids(tmp_path / "out"))
    want = np.concatenate([np.array(tok.encode(d) + [meta["eot_id"]]) for d in docs])
    np.testing.assert_array_equal(got[: len(want)], want)


@pytest.mark.parametrize("enc", ["r50k_base", "cl100k_base", "o200k_base"])
def test_long_whitespace_runs_split_as_the_pattern_says(enc, monkeypatch):
    """Independent reference: Python's `regex` module (no stack limit) splits the text with the
    encoding's own pattern (from tiktoken); each piece is then encoded alone."""
    regex = pytest.importorskip("regex")
    openai_public = pytest.importorskip("tiktoken_ext.openai_public")
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda *a, **k: {})  # only the pattern
    pat = getattr(openai_public, enc)()["pat_str"]
    t = tokshuf.Tokenizer(f"tiktoken:{enc}")
    for text in [
        "x" + " " * 1_000_000 + "b",
        "y" + " \t" * 600_000 + "\n  z",
        "\t" * 1_000_001,
        "q" + "\u2003" * 1_100_000 + "!",
    ]:
        pieces = regex.findall(pat, text)
        assert "".join(pieces) == text
        want = [i for p in pieces for i in t.encode(p)]
        assert t.encode(text) == want


def test_five_megabyte_document(tmp_path, tok):
    unit = " The quick brown fox jumps over the lazy dog."
    k = 5_000_000 // len(unit)
    src = write_jsonl(tmp_path / "big.jsonl", [unit * k, "after"])
    build([src], tmp_path / "out", seqlen=2048)
    check_repeated_unit(tmp_path / "out", tok, unit, k, ["after"])


@pytest.mark.slow
def test_hundred_megabyte_document(tmp_path, tok):
    unit = " The quick brown fox jumps over the lazy dog."
    k = (100_000_000 // len(unit) // 10_000 + 1) * 10_000
    src = tmp_path / "huge.jsonl"
    with open(src, "w") as f:
        f.write('{"id": 1, "text": "')
        for _ in range(k // 10_000):
            f.write(unit * 10_000)
        f.write('"}\n{"text": "after"}\n')
    assert src.stat().st_size > 100_000_000
    build([src], tmp_path / "out", seqlen=2048)
    check_repeated_unit(tmp_path / "out", tok, unit, k, ["after"])


def check_repeated_unit(out: Path, tok, unit: str, k: int, rest: List[str]) -> None:
    """A document of `unit` * k splits into the same pieces as `unit` k times (the unit starts
    with a space and ends with a period), so its ids are tok.encode(unit) tiled k times."""
    meta = json.loads((out / "tokshuf.json").read_text())
    eot = meta["eot_id"]
    want = np.concatenate(
        [np.tile(np.array(tok.encode(unit)), k), [eot]] + [np.array(tok.encode(d) + [eot]) for d in rest]
    )
    got = np.concatenate(chunk_ids(out))
    assert meta["num_tokens"] == len(want)
    np.testing.assert_array_equal(got[: len(want)], want)
    assert (got[len(want) :] == meta["pad_id"]).all() and len(got) - len(want) == meta["num_padding_tokens"]


# ---------------------------------------------------------------------------------------------
# Compressed streams


def gz_members(*parts: bytes) -> List[bytes]:
    return [gzip.compress(p, mtime=0) for p in parts]


def zst_frames(*parts: bytes, checksum: bool = False) -> List[bytes]:
    return [zstandard.ZstdCompressor(write_checksum=checksum).compress(p) for p in parts]


FIRST, SECOND = GOOD[:7], GOOD[7:]
STREAMS = {
    # name: (suffix, bytes, line of the failure)
    "gz-truncated-in-second-member": (
        ".jsonl.gz",
        lambda: b"".join(gz_members(jsonl_bytes(FIRST))) + gz_members(jsonl_bytes(SECOND))[0][:6],
    ),
    "gz-second-member-header-damaged": (
        ".jsonl.gz",
        lambda: (lambda m: m[0] + b"\x00" + m[1][1:])(gz_members(jsonl_bytes(FIRST), jsonl_bytes(SECOND))),
    ),
    "gz-trailing-garbage": (".jsonl.gz", lambda: gz_members(jsonl_bytes(FIRST))[0] + b"garbage!" * 4),
    "zst-truncated-in-second-frame": (
        ".jsonl.zst",
        lambda: (lambda f: f[0] + f[1][: len(f[1]) // 2])(zst_frames(jsonl_bytes(FIRST), jsonl_bytes(SECOND))),
    ),
    "zst-second-frame-magic-damaged": (
        ".jsonl.zst",
        lambda: (lambda f: f[0] + b"\x00" + f[1][1:])(zst_frames(jsonl_bytes(FIRST), jsonl_bytes(SECOND))),
    ),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_damaged_stream_after_good_data(tmp_path, tok, name):
    (
        suffix,
        make,
    ) = STREAMS[name][:2]
    src = tmp_path / f"damaged{suffix}"
    src.write_bytes(make())
    line = len(FIRST) + 1
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert_located(ei.value, src, line, "cannot decompress", f"of {src.stat().st_size} compressed bytes")
    stats = build([src], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"] == {"corrupt_stream": 1}
    [example] = stats.metadata["skipped_examples"]["corrupt_stream"]
    assert example.startswith(f"{src.name}:{line}: cannot decompress")
    assert_cache_holds(tmp_path / "skip", [FIRST], tok)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
@pytest.mark.parametrize("cut", ["one-byte", "half", "all-but-one"])
def test_truncated_compressed_file(tmp_path, suffix, cut):
    data = (gz_members if suffix == ".jsonl.gz" else zst_frames)(jsonl_bytes(make_docs(200, 9)))[0]
    keep = {"one-byte": 1, "half": len(data) // 2, "all-but-one": len(data) - 1}[cut]
    src = tmp_path / f"t{suffix}"
    src.write_bytes(data[:keep])
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert f"{src}:" in str(ei.value) and "cannot decompress" in str(ei.value)
    # Under skip: the stream error once; what decoded before it (if anything) is kept.
    other = write_jsonl(tmp_path / "ok.jsonl", GOOD)
    stats = build([src, other], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"].get("corrupt_stream") == 1
    assert set(stats.metadata["skipped"]) <= {"corrupt_stream", "invalid_json"}


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_corrupt_byte_inside_compressed_data(tmp_path, tok, suffix):
    """gzip members end in a CRC32; zstd frames only carry a checksum when written with one
    (the zstd CLI's default). Without it a flipped literal byte is undetectable by anyone."""
    parts = (jsonl_bytes(FIRST), jsonl_bytes(make_docs(50, 4)))
    members = gz_members(*parts) if suffix == ".jsonl.gz" else zst_frames(*parts, checksum=True)
    damaged = bytearray(members[1])
    damaged[len(damaged) // 2] ^= 0x55
    src = tmp_path / f"c{suffix}"
    src.write_bytes(members[0] + bytes(damaged))
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert f"{src}:" in str(ei.value)
    stats = build([src], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"]["corrupt_stream"] == 1
    # The first member decodes fully before the damage: its documents come first, in order.
    got = np.concatenate(chunk_ids(tmp_path / "skip"))
    eot = stats.metadata["eot_id"]
    want = np.array([i for d in FIRST for i in tok.encode(d) + [eot]])
    np.testing.assert_array_equal(got[: len(want)], want)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst", ".jsonl.zstd"])
def test_file_named_compressed_but_plain(tmp_path, suffix):
    src = tmp_path / f"plain{suffix}"
    src.write_bytes(jsonl_bytes(GOOD))
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert_located(ei.value, src, 1, "cannot decompress")
    other = write_jsonl(tmp_path / "ok.jsonl", GOOD)
    stats = build([src, other], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"] == {"corrupt_stream": 1}


@pytest.mark.parametrize("what", ["gzip", "zstd"])
def test_compressed_data_in_a_plain_name_is_one_corrupt_stream(tmp_path, what):
    data = jsonl_bytes(GOOD)
    src = tmp_path / "packed.jsonl"
    src.write_bytes(gzip.compress(data, mtime=0) if what == "gzip" else zstandard.ZstdCompressor().compress(data))
    with pytest.raises(tokshuf.InputError) as ei:
        build([src], tmp_path / "out")
    assert_located(ei.value, src, 1, f"holds {what}-compressed data")
    other = write_jsonl(tmp_path / "ok.jsonl", GOOD)
    stats = build([src, other], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"] == {"corrupt_stream": 1}


def test_zero_padding_after_gzip_members_is_skipped_as_gzip_does(tmp_path, tok):
    # Tape and block tools pad with zeros; gzip -d and Python's gzip module skip them.
    first, second = GOOD[:5], GOOD[5:]
    src = tmp_path / "padded.jsonl.gz"
    src.write_bytes(
        gzip.compress(jsonl_bytes(first), mtime=0)
        + bytes(100)
        + gzip.compress(jsonl_bytes(second), mtime=0)
        + bytes(512)
    )
    assert gzip.decompress(src.read_bytes()) == jsonl_bytes(GOOD)
    build([src], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [GOOD], tok)
    # Anything else after a member must be one: garbage is a damaged stream, after the lines.
    bad = tmp_path / "garbage.jsonl.gz"
    bad.write_bytes(gzip.compress(jsonl_bytes(first), mtime=0) + bytes(3) + b"junk")
    stats = build([bad], tmp_path / "skip", errors="skip")
    assert stats.metadata["skipped"] == {"corrupt_stream": 1}
    assert_cache_holds(tmp_path / "skip", [first], tok)


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_a_line_longer_than_memory_limit_allows_stops_the_build(tmp_path, errors):
    # A 40 KB .zst of 20 MiB without a newline: held whole, it would take memory far beyond
    # the limit. An eighth of the limit (at least 16 MiB) is the longest line a build holds;
    # a longer one stops it whatever `errors` says, as the limit must not change the output.
    src = tmp_path / "bomb.jsonl.zst"
    src.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(GOOD[:2]) + bytes(20 << 20)))
    with pytest.raises(tokshuf.ConfigError) as ei:
        build([src], tmp_path / "out", memory_limit=64 << 20, errors=errors)
    assert_located(ei.value, src, 3, "a line longer than 16777216 bytes", "raise memory_limit")
    # With room for it, the line is held and judged as any other.
    stats = build([src], tmp_path / "roomy", memory_limit=1 << 30, errors="skip")
    assert stats.metadata["skipped"] == {"invalid_json": 1} and stats.num_documents == 2


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_zero_byte_files_hold_no_documents(tmp_path, tok, suffix):
    empty = tmp_path / f"empty{suffix}"
    empty.write_bytes(b"")
    other = write_jsonl(tmp_path / "ok.jsonl", GOOD)
    stats = build([empty, other], tmp_path / "out")
    assert stats.metadata["skipped"] == {}
    assert [f["bytes"] for f in stats.metadata["inputs"]] == [0, other.stat().st_size]
    assert_cache_holds(tmp_path / "out", [[], GOOD], tok)


def test_valid_compressed_empty_stream(tmp_path, tok):
    a = tmp_path / "a.jsonl.gz"
    a.write_bytes(gzip.compress(b"", mtime=0))
    b = tmp_path / "b.jsonl.zst"
    b.write_bytes(zstandard.ZstdCompressor().compress(b""))
    other = write_jsonl(tmp_path / "ok.jsonl", GOOD)
    build([a, b, other], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [[], [], GOOD], tok)


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_inputs_without_any_context_build_an_empty_cache(tmp_path, tok, errors):
    """Not an error (other tests build such caches on purpose); the counts say why it is empty."""
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n{}\n")
    inputs = [empty] if errors == "raise" else [empty, bad]
    stats = build(inputs, tmp_path / "out", errors=errors)
    assert (stats.num_contexts, stats.num_chunks, stats.num_documents) == (0, 0, 0)
    assert stats.metadata["skipped"] == ({} if errors == "raise" else {"missing_text": 1})
    assert (tmp_path / "out" / "manifest.jsonl").read_bytes() == b""
    assert tokshuf.verify(tmp_path / "out", full=True).ok
    assert_cache_holds(tmp_path / "out", [[] for _ in inputs], tok)


def test_short_documents_dropped_by_tail_policy(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", ["tiny"])
    stats = build([src], tmp_path / "out", tail="drop")
    assert (
        stats.num_contexts == 0
        and stats.metadata["dropped_tokens"] == len(tokshuf.Tokenizer(tokshuf.DEFAULT_TOKENIZER).encode("tiny")) + 1
    )


# ---------------------------------------------------------------------------------------------
# Paths


def test_missing_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(tokshuf.InputNotFoundError) as ei:
        build([missing], tmp_path / "out")
    assert isinstance(ei.value, FileNotFoundError)
    assert str(missing) in str(ei.value)
    with pytest.raises(tokshuf.InputNotFoundError, match="matches no files"):
        build([str(tmp_path / "*.jsonl")], tmp_path / "out")


def test_directory_without_matching_files(tmp_path):
    d = tmp_path / "in"
    (d / "sub").mkdir(parents=True)
    (d / "notes.txt").write_text("x")
    (d / "sub" / "data.json").write_text('{"text": "x"}\n')
    with pytest.raises(tokshuf.InputNotFoundError) as ei:
        build([d], tmp_path / "out")
    assert isinstance(ei.value, FileNotFoundError)
    assert str(d) in str(ei.value) and "no .jsonl" in str(ei.value)


def test_directory_given_as_file_to_core(tmp_path):
    d = tmp_path / "x.jsonl"
    d.mkdir()
    (d / "a.jsonl").write_text('{"text": "inside"}\n')
    # Through the Python API a directory is searched...
    build([d], tmp_path / "out")
    # ...and the core refuses one passed as a file, naming it.
    with pytest.raises(tokshuf.TokshufIOError, match="is a directory"):
        tokshuf._core.build_cache(
            inputs=[str(d)], output=str(tmp_path / "o2"), seqlen=64, chunk_size=8, threads=1, progress=False
        )


def test_file_names_that_are_not_utf8(tmp_path, tok):
    # tokshuf.json records input names as UTF-8 text: such a name is refused up front, naming
    # the file (not reported missing through a lossy conversion of its name).
    d = tmp_path / "in"
    write_jsonl(d / "ok.jsonl", GOOD)
    bad = os.fsencode(d) + b"/caf\xe9.jsonl"
    with open(bad, "wb") as f:
        f.write(jsonl_bytes(GOOD))
    for given in (d, os.fsdecode(bad), bad):
        with pytest.raises(tokshuf.ConfigError, match="file name is not UTF-8"):
            build([given], tmp_path / "out")
    # bytes paths that are UTF-8 are taken as str ones.
    build([os.fsencode(d / "ok.jsonl")], tmp_path / "out")
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_fifos_and_devices_are_refused_not_waited_on(tmp_path):
    # Opening a FIFO blocks until a writer comes: found in a directory, or named directly, it
    # is refused before any file is opened. In a subprocess, so a hang fails the test.
    d = tmp_path / "in"
    write_jsonl(d / "a.jsonl", GOOD)
    os.mkfifo(d / "f.jsonl")
    code = (
        "import sys, tokshuf\n"
        "try:\n"
        "    tokshuf.build_cache([sys.argv[1]], sys.argv[2], seqlen=64, progress=False)\n"
        "except tokshuf.TokshufIOError as e:\n"
        "    print(e)\n"
    )
    for given in (d, d / "f.jsonl", "/dev/zero"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(given), str(tmp_path / "out")], capture_output=True, text=True, timeout=120
        )
        assert "not a regular file" in out.stdout, out.stdout + out.stderr


def test_a_cache_inside_its_input_directory_is_not_read_back(tmp_path, tok):
    d = tmp_path / "data"
    for i in range(3):
        write_jsonl(d / f"a{i}.jsonl", GOOD[4 * i : 4 * i + 4])
    out = d / "cache"
    first = build([d], out)
    assert [f["path"] for f in first.metadata["inputs"]] == ["a0.jsonl", "a1.jsonl", "a2.jsonl"]
    # Run again, and over it: the cache's own manifest.jsonl is not an input.
    again = build([d], out)
    assert again.metadata["inputs"] == first.metadata["inputs"]
    build([d], out, overwrite=True)
    build([str(d / "**" / "*.jsonl")], out, overwrite=True)
    assert_cache_holds(out, [GOOD[:4], GOOD[4:8], GOOD[8:]], tok)
    with pytest.raises(tokshuf.ConfigError, match="inside the build's output"):
        build([out / "manifest.jsonl"], out, overwrite=True)
    # Another build of the same folder (another seed, another output) skips that cache too:
    # it read cache/manifest.jsonl as text, and failed on its lines' missing "text" key.
    other = build([d], d / "cache_seed1", seed=1)
    assert other.metadata["inputs"] == first.metadata["inputs"]


def test_a_glob_matching_a_folder_searches_it(tmp_path, tok):
    for part in ("p1", "p2"):
        write_jsonl(tmp_path / "in" / part / "x.jsonl", GOOD[:6] if part == "p1" else GOOD[6:])
    (tmp_path / "in" / "p1" / "notes.txt").write_text("not an input")
    stats = build([str(tmp_path / "in" / "p*")], tmp_path / "out")
    assert [f["path"] for f in stats.metadata["inputs"]] == ["p1/x.jsonl", "p2/x.jsonl"]
    assert_cache_holds(tmp_path / "out", [GOOD[:6], GOOD[6:]], tok)


@pytest.mark.parametrize(
    "opts, message",
    [
        (dict(seqlen=2**24 + 1), "seqlen must be at most 16777216"),
        (dict(seqlen=2**31), "seqlen must be at most"),
        (dict(threads=4097), "threads must be between 1 and 4096"),
        (dict(threads=2**40), "threads must be between 1 and 4096"),
    ],
)
def test_sizes_no_reader_or_machine_takes_are_refused(tmp_path, opts, message):
    # A seqlen beyond what the reader accepts built a cache nobody could open; 2**40 threads
    # were started until the system refused.
    src = write_jsonl(tmp_path / "a.jsonl", GOOD)
    with pytest.raises(tokshuf.ConfigError, match=message):
        build([src], tmp_path / "out", **opts)
    assert not (tmp_path / "out").exists()


def test_same_file_given_twice_is_read_once(tmp_path, tok):
    a = write_jsonl(tmp_path / "in" / "a.jsonl", GOOD)
    (tmp_path / "in" / "link.jsonl").symlink_to(a)
    os.link(a, tmp_path / "in" / "hard.jsonl")
    stats = build([a, a, str(a), tmp_path / "in", tmp_path / "in" / "link.jsonl"], tmp_path / "out")
    assert [f["path"] for f in stats.metadata["inputs"]] == ["a.jsonl"]
    assert_cache_holds(tmp_path / "out", [GOOD], tok)


def test_symlink_loops_in_input_directories(tmp_path, tok):
    d = tmp_path / "in"
    write_jsonl(d / "a.jsonl", GOOD[:4])
    write_jsonl(d / "sub" / "b.jsonl", GOOD[4:])
    (d / "loop").symlink_to(d)  # d/loop/loop/loop/... forever
    (d / "sub" / "up").symlink_to("..")
    (d / "sub" / "self").symlink_to(".")
    stats = build([d], tmp_path / "out")
    assert [Path(f["path"]).name for f in stats.metadata["inputs"]] == ["a.jsonl", "b.jsonl"]
    assert_cache_holds(tmp_path / "out", [GOOD[:4], GOOD[4:]], tok)


def test_looping_or_dangling_file_links_are_named(tmp_path):
    d = tmp_path / "in"
    write_jsonl(d / "a.jsonl", GOOD)
    (d / "x.jsonl").symlink_to(d / "y.jsonl")
    (d / "y.jsonl").symlink_to(d / "x.jsonl")
    with pytest.raises(tokshuf.InputNotFoundError) as ei:
        build([d], tmp_path / "out")
    assert str(d / "x.jsonl") in str(ei.value) and "symbolic link" in str(ei.value)
    with pytest.raises(tokshuf.InputNotFoundError, match="symbolic link to nothing"):
        build([d / "y.jsonl"], tmp_path / "out")


def _as_nobody(fn) -> dict:
    """Run fn() in a forked child that dropped root (root reads any file, so a permission test
    must not run as root). No exec: the interpreter may live where `nobody` cannot reach."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                fn()
                res = {"error": None}
            except BaseException as e:
                res = {"error": [c.__name__ for c in type(e).__mro__], "message": str(e)}
            os.write(w, json.dumps(res).encode())
        finally:
            os._exit(0)
    os.close(w)
    deadline = time.monotonic() + 300
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("child timed out")
        time.sleep(0.05)
    with os.fdopen(r, "rb") as f:
        return json.loads(f.read() or b'{"error": ["no report"]}')


@pytest.fixture
def shared_dir():
    """A folder outside pytest's private (0700) tmp tree, usable by an unprivileged child."""
    d = Path(tempfile.mkdtemp(prefix="tokshuf-perm-"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("what", ["file", "directory"])
def test_unreadable_input(shared_dir, what):
    good = write_jsonl(shared_dir / "in" / "a.jsonl", GOOD)
    if what == "file":
        locked = write_jsonl(shared_dir / "in" / "b.jsonl", GOOD)
        target = [good, locked]
    else:
        locked = shared_dir / "in" / "sub"
        write_jsonl(locked / "c.jsonl", GOOD)
        target = [shared_dir / "in"]
    for p in [shared_dir / "in", good.parent]:
        p.chmod(0o777)
    good.chmod(0o644)
    locked.chmod(0)
    out = shared_dir / "out"

    def attempt():
        build(target, out)

    if os.geteuid() == 0:
        res = _as_nobody(attempt)
    else:
        try:
            attempt()
            res = {"error": None}
        except tokshuf.TokshufError as e:
            res = {"error": [c.__name__ for c in type(e).__mro__], "message": str(e)}
    assert res["error"] is not None, "an unreadable input must not be skipped silently"
    assert "TokshufPermissionError" in res["error"] and "PermissionError" in res["error"], res
    assert str(locked) in res["message"]


@pytest.mark.parametrize("edit", ["appended", "cut", "rewritten at the same size"])
def test_an_input_changed_while_the_build_runs_stops_it(tmp_path, edit):
    """tokshuf.json records each input's size when the build lists it; a file of another size
    when it is read would make a cache of other data than the recipe says (and its resume
    would then mix the two): the build stops with a typed error instead."""
    from support.build import BuildProcess

    inputs = []
    for k in range(3):
        p = tmp_path / "in" / f"p{k}.jsonl"
        write_jsonl(p, make_docs(60, seed=k))
        inputs.append(p)
    out = tmp_path / "out"
    gate = tmp_path / "gate"
    b = BuildProcess(inputs, out, dict(seqlen=32, threads=1, progress=False), {"TOKSHUF_TEST_GATE": f"start:{gate}"})
    b.wait_trace("gate start")  # listed, nothing read yet
    victim = inputs[1]
    text = victim.read_text()
    if edit == "appended":
        victim.write_text(text + json.dumps({"text": "one more"}) + "\n")
    elif edit == "cut":
        victim.write_text(text[: len(text) // 2].rsplit("\n", 1)[0] + "\n")
    else:  # not seen by this run (a resume sees it by its mtime): only no false alarm is checked
        victim.write_text(text)
    gate.write_text("go")
    _, err = b.proc.communicate(timeout=120)
    if edit == "rewritten at the same size":
        assert b.proc.returncode == 0, err.decode()
        return
    assert b.proc.returncode != 0
    assert "TokshufIOError" in err.decode() and "p1.jsonl: changed while the build ran" in err.decode(), err.decode()
