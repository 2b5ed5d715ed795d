"""``tokshuf verify``: a sound cache passes; altered, truncated or crafted ones are caught."""

from __future__ import annotations

import builtins
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tokshuf
from support.corpus import make_docs, write_jsonl
from support.reader import FORMATS
from tokshuf.__main__ import main

SEQLEN = 64
CHUNK = 16


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One pristine cache per format; tests work on copies."""
    root = tmp_path_factory.mktemp("verify")
    src = write_jsonl(root / "in" / "a.jsonl", make_docs(60, 11))
    caches = {}
    for fmt in FORMATS:
        out = root / fmt
        blocks = dict(block_size=5) if fmt.startswith("blocks") else {}  # chunks end in a short block
        tokshuf.build_cache(
            [src], out, seqlen=SEQLEN, chunk_size=CHUNK, threads=2, progress=False, format=fmt, **blocks
        )
        caches[fmt] = out
    return caches


@pytest.fixture(params=FORMATS)
def cache(request, built, tmp_path):
    dst = tmp_path / "cache"
    shutil.copytree(built[request.param], dst)
    return dst


@pytest.fixture
def npy_cache(built, tmp_path):
    dst = tmp_path / "cache"
    shutil.copytree(built["npy"], dst)
    return dst


def manifest(cache: Path):
    return [json.loads(line) for line in (cache / "manifest.jsonl").read_text().splitlines()]


def write_manifest(cache: Path, lines) -> None:
    (cache / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def edit_meta(cache: Path, **changes) -> None:
    meta = json.loads((cache / "tokshuf.json").read_text())
    meta.update(changes)
    (cache / "tokshuf.json").write_text(json.dumps(meta))


def problems(cache: Path, full: bool = False) -> str:
    report = tokshuf.verify(cache, full=full)
    assert not report.ok
    return "\n".join(report.problems)


def flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def test_sound_cache_passes(cache):
    meta = json.loads((cache / "tokshuf.json").read_text())
    for full in (False, True):
        report = tokshuf.verify(cache, full=full)
        assert report.ok, report.summary()
        assert report.num_shards == meta["num_chunks"] > 2
        assert report.num_contexts == meta["num_contexts"]
        assert report.num_bytes == sum(m["bytes"] for m in manifest(cache))
        assert "result      OK" in report.summary()
    assert report.raise_if_bad() is report


def test_uint32_cache_passes(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", make_docs(20, 2))
    out = tmp_path / "c"
    tokshuf.build_cache([src], out, tokenizer="tiktoken:o200k_base", seqlen=32, chunk_size=8, progress=False)
    assert json.loads((out / "tokshuf.json").read_text())["dtype"] == "uint32"
    assert tokshuf.verify(out, full=True).ok


def test_cli_exit_codes(cache, capsys):
    assert main(["verify", str(cache), "--full"]) == 0
    assert "OK" in capsys.readouterr().out
    (cache / "shard_00000001.tar").unlink()
    assert main(["verify", str(cache)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "shard_00000001.tar: missing" in out


def test_cli_as_a_program(cache):
    def run(*a):
        return subprocess.run([sys.executable, "-m", "tokshuf", "verify", *a], capture_output=True, text=True)

    assert run(str(cache), "--full", "-q").returncode == 0
    flip(cache / "shard_00000000.tar", os.path.getsize(cache / "shard_00000000.tar") // 2 + 1)
    r = run(str(cache), "--full")
    assert r.returncode == 1 and "sha256" in r.stdout


def test_flipped_byte_found_by_full_check(npy_cache):
    shard = npy_cache / "shard_00000002.tar"
    # The low bit of an id's low byte: still a valid id, so only the hash can tell.
    stride = 512 + -(-(128 + SEQLEN * 2) // 512) * 512
    flip(shard, 3 * stride + 512 + 128 + 10)
    assert tokshuf.verify(npy_cache).ok
    assert "shard_00000002.tar: sha256" in problems(npy_cache, full=True)


def test_flipped_byte_in_json_member_found(built, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(built["json.gz"], cache)
    shard = cache / "shard_00000001.tar"
    flip(shard, 512 + 30, 0xFF)  # inside the first member's gzip data
    assert "shard_00000001.tar: member 0" in problems(cache)


def test_flipped_byte_in_zstd_block_found(built, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(built["blocks.zst"], cache)
    flip(cache / "shard_00000001.tar", 512 + 200, 0xFF)  # inside the first block's frame
    assert "shard_00000001.tar: member 0" in problems(cache)
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000001\.tar"):
        tokshuf.Cache(cache)[:]  # the reader's own check: the frame's checksum or its size


def test_id_out_of_vocabulary_in_a_block(built, tmp_path):
    cache = tmp_path / "c"
    shutil.copytree(built["blocks"], cache)
    shard = cache / "shard_00000000.tar"
    data = bytearray(shard.read_bytes())
    data[512 + 128 + 2 * SEQLEN : 512 + 130 + 2 * SEQLEN] = (65535).to_bytes(2, "little")  # row 1 of block 0
    shard.write_bytes(bytes(data))
    assert "shard_00000000.tar: member 0: id 65535" in problems(cache)


def test_id_out_of_vocabulary(npy_cache):
    shard = npy_cache / "shard_00000000.tar"
    data = bytearray(shard.read_bytes())
    data[512 + 128 : 512 + 130] = (65535).to_bytes(2, "little")
    shard.write_bytes(bytes(data))
    assert "id 65535 >= vocab size 50257" in problems(npy_cache)


@pytest.mark.parametrize(
    "member,offset,what",
    [
        (2, 5, "name"),
        (2, 130, "header differs"),
        (2, 150, "checksum"),
        (2, 257, "header differs"),
        (2, 156, "header differs"),
        (1, 512 + 20, "npy header differs"),
        (0, 257, "not a POSIX ustar header"),
        (0, 156, "member type"),
        (0, 5, "name"),
        (0, 512 + 20, "npy header"),
        (0, 512 + 1, "npy magic"),
    ],
)
def test_damaged_headers(npy_cache, member, offset, what):
    stride = 512 + -(-(128 + SEQLEN * 2) // 512) * 512
    flip(npy_cache / "shard_00000003.tar", member * stride + offset, 0x04)
    found = problems(npy_cache)
    assert f"shard_00000003.tar: member {member}: " in found
    assert what in found, found


def test_nonzero_padding_and_trailer(npy_cache):
    shard = npy_cache / "shard_00000000.tar"
    size = shard.stat().st_size
    flip(shard, size - 10)
    assert "trailer" in problems(npy_cache)
    flip(shard, size - 10)
    stride = 512 + -(-(128 + SEQLEN * 2) // 512) * 512
    flip(shard, stride - 3)  # after member 0's ids, before member 1's header
    assert "padding after the ids" in problems(npy_cache)


def test_truncated_shard(cache):
    shard = cache / "shard_00000001.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:-700])
    assert "shard_00000001.tar:" in problems(cache) and "truncated" in problems(cache)
    # Also when the manifest is edited to match the short file: the layout gives it away.
    lines = manifest(cache)
    lines[1]["bytes"] = len(data) - 700
    write_manifest(cache, lines)
    assert "shard_00000001.tar:" in problems(cache)


def test_grown_shard(cache):
    with open(cache / "shard_00000000.tar", "ab") as f:
        f.write(b"\0" * 512)
    assert "longer than written" in problems(cache)


def test_missing_shard(cache):
    (cache / "shard_00000002.tar").unlink()
    assert "shard_00000002.tar: missing" in problems(cache)


def test_shard_that_is_a_directory(cache):
    (cache / "shard_00000002.tar").unlink()
    (cache / "shard_00000002.tar").mkdir()
    assert "not a regular file" in problems(cache)


def test_manifest_count_mismatch(cache):
    lines = manifest(cache)
    lines[0]["num_sequences"] -= 1
    lines[0]["num_tokens"] = min(lines[0]["num_tokens"], lines[0]["num_sequences"] * SEQLEN)
    write_manifest(cache, lines)
    found = problems(cache)
    assert "contexts in all" in found and "num_contexts" in found


def test_manifest_missing_a_line(cache):
    write_manifest(cache, manifest(cache)[:-1])
    assert "tokshuf.json says num_chunks" in problems(cache)


def test_manifest_without_final_newline(cache):
    text = (cache / "manifest.jsonl").read_text()
    (cache / "manifest.jsonl").write_text(text.rstrip("\n"))
    assert "no newline" in problems(cache)


def test_manifest_out_of_order(cache):
    lines = manifest(cache)
    lines[0], lines[1] = lines[1], lines[0]
    write_manifest(cache, lines)
    assert "out of order" in problems(cache)


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "/etc/passwd",
        "shard_00000000/../../x",
        "shard_00000000.tar",
        "shard_0000000a",
        "shard_\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660",
        "shard_000000000",
        "",
        None,
        7,
        "shard_00000000\n",
    ],
)
def test_crafted_shard_names_never_opened(cache, tmp_path, monkeypatch, name):
    outside = tmp_path / "x.tar"
    outside.write_bytes(b"secret")
    lines = manifest(cache)
    lines[0]["shard"] = name
    write_manifest(cache, lines)
    opened = []
    real_open, real_stat = builtins.open, os.stat
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: (opened.append(os.fspath(p)), real_open(p, *a, **k))[1])
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (opened.append(os.fspath(p)), real_stat(p, *a, **k))[1])
    report = tokshuf.verify(cache, full=True)
    monkeypatch.undo()
    assert not report.ok
    assert "manifest.jsonl:1: shard" in report.problems[0]
    root = os.path.realpath(cache)
    assert opened and all(os.path.realpath(p) == root or os.path.realpath(p).startswith(root + os.sep) for p in opened)


@pytest.mark.parametrize(
    "key,value",
    [
        ("num_sequences", -1),
        ("num_sequences", 10**30),
        ("num_sequences", 0),
        ("num_sequences", "16"),
        ("num_sequences", True),
        ("num_sequences", 1.0),
        ("bytes", -5),
        ("num_tokens", 10**12),
        ("num_tokens", -1),
        ("sha256", "../../x"),
        ("sha256", 5),
    ],
)
def test_crafted_manifest_values(cache, key, value):
    lines = manifest(cache)
    lines[1][key] = value
    write_manifest(cache, lines)
    assert "manifest.jsonl:2:" in problems(cache)


@pytest.mark.parametrize(
    "key,value",
    [
        ("num_contexts", -1),
        ("seqlen", 0),
        ("seqlen", 10**20),
        ("chunk_size", -16),
        ("num_chunks", 10**18),
        ("status", "building"),
        ("format_version", 2),
        ("dtype", "float64"),
        ("format", "pickle"),
        ("eot_id", 10**6),
        ("tokenizer", {"spec": "x", "vocab_size": 10**6}),
        ("num_tokens", 3),
        ("ideal_readers", 0),
        ("ideal_readers", "8"),
        ("recipe", None),  # verify's own checks pass it: the reader's refuse it
    ],
)
def test_crafted_metadata(cache, key, value):
    edit_meta(cache, **{key: value})
    assert problems(cache)


def test_what_the_reader_refuses_verify_reports(cache):
    edit_meta(cache, recipe=[1])
    with pytest.raises(tokshuf.CacheCorruptError, match="recipe"):
        tokshuf.Cache(cache)
    assert "the reader refuses it" in problems(cache) and "recipe" in problems(cache)


def test_not_a_cache(tmp_path):
    assert "not a folder" in problems(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert "tokshuf.json: missing" in problems(tmp_path / "empty")
    (tmp_path / "empty" / "tokshuf.json").write_text("{not json")
    assert "unreadable" in problems(tmp_path / "empty")
    (tmp_path / "empty" / "tokshuf.json").write_text("[1, 2]")
    assert "not a JSON object" in problems(tmp_path / "empty")


def test_leftovers_are_warnings(cache):
    (cache / "shard_00000099.tar.tmp").write_bytes(b"x")
    report = tokshuf.verify(cache)
    assert report.ok and any("shard_00000099.tar.tmp" in w for w in report.warnings)


def test_raise_if_bad(cache):
    (cache / "shard_00000000.tar").unlink()
    with pytest.raises(tokshuf.CacheCorruptError, match=r"shard_00000000.tar: missing") as ei:
        tokshuf.verify(cache).raise_if_bad()
    assert isinstance(ei.value, ValueError)


def test_ids_read_back_equal_the_reference_decoder(npy_cache):
    """verify's strided view and the tar members agree (the view is what it checks)."""
    import io
    import tarfile

    stride = 512 + -(-(128 + SEQLEN * 2) // 512) * 512
    shard = npy_cache / "shard_00000000.tar"
    raw = np.fromfile(shard, dtype=np.uint8)
    rows = raw[: CHUNK * stride].reshape(CHUNK, stride)[:, 512 + 128 : 512 + 128 + SEQLEN * 2].view("<u2")
    with tarfile.open(shard) as tar:
        ref = np.stack([np.load(io.BytesIO(tar.extractfile(m).read())) for m in tar.getmembers()])
    np.testing.assert_array_equal(rows, ref)


def test_oversized_manifest_is_not_loaded(cache):
    with open(cache / "manifest.jsonl", "ab") as f:
        f.write(b" " * (1 << 20) + b"\n")
    assert "far more than" in problems(cache)


@pytest.mark.parametrize(
    "text,ids",
    [
        (b"[1,2,3]", [1, 2, 3]),
        (b"[ 1, 2 ,3 ]", [1, 2, 3]),
        (b"[0]", [0]),
        (b"[]", None),
        (b"[ ]", None),
        (b"[1,,2]", None),
        (b"[1,2,]", None),
        (b"[,1]", None),
        (b"[1 2]", None),
        (b"[1, ,2]", None),
        (b"[true]", None),
        (b"[1.5]", None),
        (b"[-1]", None),
        (b"1,2", None),
        (b"[1]x", None),
    ],
)
def test_json_id_lists_are_parsed_strictly(text, ids):
    from tokshuf._verify import _id_list

    got = _id_list(text)
    assert (got is None and ids is None) or list(got) == ids
    big = _id_list(b"[99999999999999999999]")  # saturates: never wraps to a small id
    assert big is not None and big[0] >= 2**32
