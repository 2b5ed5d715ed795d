"""``tokshuf.verify``: check a cache on disk against its own metadata (docs/format.md §2, §3, §8).

Checks, in order: tokshuf.json (complete, known format, sane values), manifest.jsonl (strict
shard names in chunk order, counts that add up to tokshuf.json), then every shard: size, tar
layout (ustar headers, member names, fixed stride for npy), npy headers (2-D blocks of
``block_size`` contexts for the block formats, decompressed for ``blocks.zst``), every id below
the vocabulary size, and with ``full=True`` the sha256 recorded in the manifest.

Only files named by a validated manifest line (``shard_NNNNNNNN.tar`` inside the folder) are
ever opened; nothing is unpickled or executed, and no size read from a file is trusted before
it is compared with the real file size, so a crafted cache cannot make this allocate much.

This checker is deliberately independent of the Rust core: it re-derives the format from the
specification with the standard library and NumPy instead of calling the core's parsers, so a
bug shared by the core's writer and reader (which would make them agree with each other) still
shows up here. The cost is a second implementation of the layout rules, kept small.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tempfile
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from ._inputs import URL_SCHEMES, location
from .exceptions import CacheCorruptError, ConfigError, TokshufError

TAR_BLOCK = 512
SHARD_RE = re.compile(r"shard_[0-9]{8}")
SHA_RE = re.compile(r"[0-9a-f]{64}")
_SPACED_DIGITS = re.compile(rb"[0-9]\s+[0-9]")
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
FORMATS = ("npy", "json.gz", "blocks", "blocks.zst")
MAX_BLOCK_SIZE = 1 << 16
ROWS_PER_BLOCK = 2048  # npy members checked at once: bounds memory whatever the chunk size
MAX_REPORTED = 50


@dataclass
class VerifyReport:
    """What ``verify`` found. ``ok`` is true when ``problems`` is empty."""

    path: str
    full: bool
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    num_shards: int = 0
    num_contexts: int = 0
    num_bytes: int = 0
    metadata: Optional[Dict[str, Any]] = field(default=None, repr=False)
    omitted: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems and not self.omitted

    def __bool__(self) -> bool:
        return self.ok

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_REPORTED:
            self.problems.append(text)
        else:
            self.omitted += 1

    def summary(self) -> str:
        m = self.metadata or {}
        lines = [f"tokshuf verify: {self.path}"]
        if m:
            tok = m.get("tokenizer") if isinstance(m.get("tokenizer"), dict) else {}
            lines.append(
                f"  metadata    format {m.get('format_version')}, status {m.get('status')}, "
                f"{m.get('num_chunks')} chunks of {m.get('chunk_size')}, seqlen {m.get('seqlen')}, "
                f"{m.get('dtype')} ({m.get('format')}), vocab {tok.get('vocab_size')}"
            )
        lines.append(
            f"  checked     {self.num_shards} shards, {self.num_contexts:,} contexts, "
            f"{self.num_bytes / 1e6:,.1f} MB; sha256 {'checked' if self.full else 'not checked (use --full)'}"
        )
        for w in self.warnings:
            lines.append(f"  warning     {w}")
        if self.ok:
            lines.append("  result      OK")
        else:
            n = len(self.problems) + self.omitted
            lines.append(f"  result      FAILED: {n} problem{'s' if n != 1 else ''}")
            lines.extend(f"    {p}" for p in self.problems)
            if self.omitted:
                lines.append(f"    ... and {self.omitted} more")
        return "\n".join(lines)

    def raise_if_bad(self) -> VerifyReport:
        """Raise :class:`CacheCorruptError` listing the problems, if any."""
        if not self.ok:
            raise CacheCorruptError(f"{self.path}: " + "; ".join(self.problems[:10]))
        return self


def verify(path: Union[str, os.PathLike[str]], full: bool = False) -> VerifyReport:
    """Check the cache at ``path`` (a folder, or an object-store URL) against the format
    (docs/bad-input.md says what is checked).

    Args:
        path: the cache folder.
        full: also hash every shard and compare it with the manifest's sha256 (reads every byte).

    Returns:
        A :class:`VerifyReport`: problems are reported, not raised; call
        ``report.raise_if_bad()`` to turn them into a :class:`tokshuf.CacheCorruptError`.
    """
    text = location(path)
    if isinstance(text, str) and text.startswith(URL_SCHEMES):
        return _verify_remote(text.rstrip("/"), full)
    root = Path(text)
    report = VerifyReport(path=str(root), full=full)
    if not root.is_dir():
        report.problem(f"{root}: not a folder")
        return report
    meta = _check_metadata(root, report)
    if meta is None:
        return report
    if meta.get("packing") == "none":
        _verify_unpacked(root, meta, full, report)
    else:
        manifest = _check_manifest(root, meta, report)
        if manifest is None:
            return report
        _check_folder(root, manifest, report)
        header: Dict[str, bytes] = {}
        for k, line in enumerate(manifest):
            _check_shard(root, meta, k, line, full, header, report)
    _check_opens(str(root), meta, report)
    return report


def _check_opens(path: str, meta: Dict[str, Any], report: VerifyReport) -> None:
    """A cache called sound must open. The checks above re-derive the format on their own;
    this runs the reader's as well, so whatever the reader refuses is reported here too."""
    if not report.ok:
        return
    from . import _core

    try:
        if meta.get("packing") == "none":
            _core.UnpackedCache(path, True)
        else:
            _core.Cache(path, True)
    except TokshufError as e:
        report.problem(f"the reader refuses it: {e}")


def _verify_remote(url: str, full: bool) -> VerifyReport:
    """A cache in an object store, with the same checks: tokshuf.json and manifest.jsonl are
    fetched into a temporary folder, then each shard in turn, checked there and removed, so at
    most one shard is on local disk. (The store's own transfer is checked by the storage layer;
    what is checked here is what the store holds.)"""
    from . import _core

    report = VerifyReport(path=url, full=full)
    listed = {u[len(url) + 1 :]: size for u, size in _core._storage_list(url + "/")}
    with tempfile.TemporaryDirectory(prefix="tokshuf-verify-") as tmp:
        root = Path(tmp)

        def fetch(name: str) -> None:
            if name in listed:
                (root / name).write_bytes(_core._storage_read(f"{url}/{name}"))

        fetch("tokshuf.json")
        fetch("manifest.jsonl")
        meta = _check_metadata(root, report)
        if meta is None:
            return report
        if meta.get("packing") == "none":
            raise ConfigError(
                f"{url}: verifying an unpacked (packing='none') cache in a store is not supported; verify a local copy"
            )
        manifest = _check_manifest(root, meta, report)
        if manifest is None:
            return report
        known = {"tokshuf.json", "manifest.jsonl"} | {m["shard"] + ".tar" for m in manifest}
        _warn_extra(sorted({n.split("/", 1)[0] for n in listed} - known), report)
        header: Dict[str, bytes] = {}
        for k, line in enumerate(manifest):
            name = f"{line['shard']}.tar"
            if "bytes" not in line or listed.get(name) == line["bytes"]:
                fetch(name)  # a wrong size is reported without downloading the shard
            elif name in listed:
                report.problem(f"{name}: {listed[name]} bytes, manifest says {line['bytes']}")
                continue
            _check_shard(root, meta, k, line, full, header, report)
            (root / name).unlink(missing_ok=True)
    _check_opens(url, meta, report)
    return report


# ------------------------------------------------------------------------------------------------
# tokshuf.json


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_metadata(root: Path, report: VerifyReport) -> Optional[Dict[str, Any]]:
    p = root / "tokshuf.json"
    try:
        meta = json.loads(p.read_bytes())
    except FileNotFoundError:
        report.problem("tokshuf.json: missing (not a tokshuf cache)")
        return None
    except (OSError, ValueError) as e:
        report.problem(f"tokshuf.json: unreadable ({e})")
        return None
    if not isinstance(meta, dict):
        report.problem("tokshuf.json: not a JSON object")
        return None
    report.metadata = meta
    bad = len(report.problems)

    def need_int(key: str, lo: int = 0, hi: Optional[int] = None, where: Dict[str, Any] = meta, name: str = "") -> None:
        v = where.get(key)
        if not _is_int(v) or v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            report.problem(f"tokshuf.json: {name or key} is {v!r}, expected an integer {rng}")

    if meta.get("format_version") != 1:
        report.problem(f"tokshuf.json: format_version {meta.get('format_version')!r} is not 1")
    if meta.get("status") != "complete":
        report.problem(f"tokshuf.json: status {meta.get('status')!r}: the build is not complete")
    for key in ("seqlen", "chunk_size"):
        need_int(key, 1)
    for key in ("num_chunks", "num_contexts", "num_tokens", "num_documents", "num_padding_tokens"):
        need_int(key, 0)
    if meta.get("dtype") not in DTYPES:
        report.problem(f"tokshuf.json: dtype {meta.get('dtype')!r} is not uint16 or uint32")
    if meta.get("format") not in FORMATS:
        report.problem(f"tokshuf.json: format {meta.get('format')!r} is not one of {', '.join(FORMATS)}")
    elif str(meta["format"]).startswith("blocks"):
        need_int("block_size", 1, MAX_BLOCK_SIZE)
    if meta.get("ideal_readers") is not None:
        need_int("ideal_readers", 1)
    if not isinstance(meta.get("shuffle"), bool):
        report.problem(f"tokshuf.json: shuffle is {meta.get('shuffle')!r}, expected true or false")
    tok = meta.get("tokenizer")
    if not isinstance(tok, dict):
        report.problem("tokshuf.json: tokenizer is not an object")
    else:
        need_int("vocab_size", 1, 2**32, where=tok, name="tokenizer.vocab_size")
        if not isinstance(tok.get("spec"), str):
            report.problem("tokshuf.json: tokenizer.spec is not a string")
    if len(report.problems) > bad:
        return None
    vocab = tok["vocab_size"]
    for key in ("eot_id", "pad_id"):
        need_int(key, 0, vocab - 1)
    if meta.get("bos_id") is not None:
        need_int("bos_id", 0, vocab - 1)
    if meta["dtype"] == "uint16" and vocab > 1 << 16:
        report.problem(f"tokshuf.json: dtype uint16 cannot hold a vocabulary of {vocab}")
    if meta.get("packing") == "none":
        if meta["num_padding_tokens"] != 0:
            report.problem(f"tokshuf.json: num_padding_tokens {meta['num_padding_tokens']} in an unpacked cache")
    elif meta["num_tokens"] + meta["num_padding_tokens"] != meta["num_contexts"] * meta["seqlen"]:
        report.problem(
            f"tokshuf.json: num_tokens {meta['num_tokens']} + num_padding_tokens {meta['num_padding_tokens']} "
            f"!= num_contexts {meta['num_contexts']} x seqlen {meta['seqlen']}"
        )
    sizes = meta.get("chunk_sizes")
    if sizes is not None and not (
        isinstance(sizes, list) and len(sizes) == meta["num_chunks"] and all(_is_int(s) for s in sizes)
    ):
        report.problem("tokshuf.json: chunk_sizes is not a list of num_chunks integers")
    return meta if len(report.problems) == bad else None


# ------------------------------------------------------------------------------------------------
# manifest.jsonl


def _check_manifest(root: Path, meta: Dict[str, Any], report: VerifyReport) -> Optional[List[Dict[str, Any]]]:
    p = root / "manifest.jsonl"
    try:
        size = p.stat().st_size
        limit = (meta["num_chunks"] + 1) * 4096  # a line is ~150 bytes; do not load a crafted giant
        if size > limit:
            report.problem(f"manifest.jsonl: {size} bytes, far more than {meta['num_chunks']} lines need")
            return None
        data = p.read_bytes()
    except OSError as e:
        report.problem(f"manifest.jsonl: {'missing' if isinstance(e, FileNotFoundError) else e}")
        return None
    if data and not data.endswith(b"\n"):
        report.problem("manifest.jsonl: last line has no newline (truncated?)")
    bad = len(report.problems)
    lines: List[Dict[str, Any]] = []
    for k, raw in enumerate(data.splitlines()):
        where = f"manifest.jsonl:{k + 1}"
        try:
            line = json.loads(raw)
        except ValueError as e:
            report.problem(f"{where}: not JSON ({e})")
            continue
        if not isinstance(line, dict):
            report.problem(f"{where}: not a JSON object")
            continue
        shard = line.get("shard")
        if not isinstance(shard, str) or not SHARD_RE.fullmatch(shard):
            # Never used as a path: '../x', '/abs', 'a/b' all end here.
            report.problem(f"{where}: shard {shard!r} is not a name of the form shard_NNNNNNNN")
            continue
        if shard != f"shard_{k:08d}":
            report.problem(f"{where}: shard {shard} out of order (expected shard_{k:08d})")
        n = line.get("num_sequences")
        if not _is_int(n) or not 1 <= n <= meta["chunk_size"]:
            report.problem(f"{where}: num_sequences {n!r} is not in [1, chunk_size {meta['chunk_size']}]")
            continue
        t = line.get("num_tokens")
        if t is not None and (not _is_int(t) or not 0 <= t <= n * meta["seqlen"]):
            report.problem(f"{where}: num_tokens {t!r} is not in [0, {n} x {meta['seqlen']}]")
        b = line.get("bytes")
        if b is not None and (not _is_int(b) or b < 0):
            report.problem(f"{where}: bytes {b!r} is not a non-negative integer")
        h = line.get("sha256")
        if h is not None and (not isinstance(h, str) or not SHA_RE.fullmatch(h)):
            report.problem(f"{where}: sha256 {h!r} is not 64 lowercase hex digits")
        lines.append(line)
    if len(report.problems) > bad:
        return None
    if len(lines) != meta["num_chunks"]:
        report.problem(f"manifest.jsonl: {len(lines)} shards, tokshuf.json says num_chunks {meta['num_chunks']}")
    total = sum(m["num_sequences"] for m in lines)
    if total != meta["num_contexts"]:
        report.problem(
            f"manifest.jsonl: {total} contexts in all, tokshuf.json says num_contexts {meta['num_contexts']}"
        )
    if all("num_tokens" in m for m in lines):
        tokens = sum(m["num_tokens"] for m in lines)
        if tokens != meta["num_tokens"]:
            report.problem(f"manifest.jsonl: {tokens} tokens in all, tokshuf.json says num_tokens {meta['num_tokens']}")
    sizes = meta.get("chunk_sizes")
    if sizes is not None:
        for k, (m, s) in enumerate(zip(lines, sizes)):
            if m["num_sequences"] != s:
                report.problem(f"manifest.jsonl:{k + 1}: num_sequences {m['num_sequences']}, chunk_sizes says {s}")
    elif meta["shuffle"]:
        # Shuffled chunks are cut from one global order: only the last may be short.
        for k, m in enumerate(lines[:-1]):
            if m["num_sequences"] != meta["chunk_size"]:
                report.problem(
                    f"manifest.jsonl:{k + 1}: num_sequences {m['num_sequences']} != chunk_size (not the last chunk)"
                )
    return lines if len(report.problems) == bad else None


def _check_folder(
    root: Path, manifest: List[Dict[str, Any]], report: VerifyReport, sidecars: bool = False, where: str = ""
) -> None:
    known = {"tokshuf.json", "manifest.jsonl"} | {m["shard"] + ".tar" for m in manifest}
    if sidecars:
        known = (known - {"tokshuf.json"}) | {m["shard"] + ".idx" for m in manifest}
    _warn_extra(sorted(n for n in os.listdir(root) if n not in known), report, where)


def _warn_extra(extra: List[str], report: VerifyReport, where: str = "") -> None:
    if extra:
        shown = ", ".join(extra[:5]) + (", ..." if len(extra) > 5 else "")
        report.warnings.append(
            f"{where}{len(extra)} other entr{'ies' if len(extra) != 1 else 'y'} in the folder: {shown}"
        )


# ------------------------------------------------------------------------------------------------
# Shards


def _parse_octal(field_: bytes) -> Optional[int]:
    text = field_.split(b"\0", 1)[0].strip(b" ")
    if not text or any(c not in b"01234567" for c in text):
        return None
    return int(text, 8)


def _check_tar_header(block: bytes, name: str) -> Optional[str]:
    """None if `block` is a plain ustar header of a regular file `name`, else what is wrong."""
    if block[257:263] != b"ustar\0" or block[263:265] != b"00":
        return "not a POSIX ustar header"
    got = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].strip(b"\0")
    if got != name.encode() or prefix:
        shown = (prefix + b"/" if prefix else b"") + got
        return f"member name {shown[:60]!r}, expected {name}"
    if block[156:157] not in (b"0", b"\0"):
        return f"member type {block[156:157]!r} is not a regular file (links and PAX/GNU records are not allowed)"
    stored = _parse_octal(block[148:156])
    computed = sum(block[:148]) + 8 * 32 + sum(block[156:])
    if stored != computed:
        return f"header checksum {stored} != {computed}"
    if _parse_octal(block[124:136]) is None:
        return "size field is not octal"
    return None


def _check_shard(
    root: Path,
    meta: Dict[str, Any],
    k: int,
    line: Dict[str, Any],
    full: bool,
    header: Dict[str, bytes],
    report: VerifyReport,
) -> None:
    name = f"{line['shard']}.tar"
    p = root / name
    try:
        st = os.stat(p)
    except OSError as e:
        report.problem(f"{name}: {'missing' if isinstance(e, FileNotFoundError) else e}")
        return
    if not stat.S_ISREG(st.st_mode):
        report.problem(f"{name}: not a regular file")
        return
    size = st.st_size
    if "bytes" in line and size != line["bytes"]:
        what = "truncated" if size < line["bytes"] else "longer than written"
        report.problem(f"{name}: {size} bytes, manifest says {line['bytes']} ({what})")
        return
    report.num_shards += 1
    report.num_bytes += size
    try:
        with open(p, "rb") as f:
            if meta["format"] == "npy":
                ok = _check_npy_shard(f, name, size, meta, k, line["num_sequences"], header, report)
            elif meta["format"].startswith("blocks"):
                ok = _check_blocks_shard(f, name, size, meta, k, line["num_sequences"], report)
            else:
                ok = _check_json_shard(f, name, size, meta, k, line["num_sequences"], report)
    except OSError as e:
        report.problem(f"{name}: cannot read ({e})")
        return
    if ok:
        report.num_contexts += line["num_sequences"]
    if full:
        if "sha256" not in line:
            report.warnings.append(f"{name}: the manifest has no sha256 to compare with")
        else:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(8 << 20), b""):
                    h.update(block)
            if h.hexdigest() != line["sha256"]:
                report.problem(
                    f"{name}: sha256 {h.hexdigest()[:16]}... differs from the manifest's {line['sha256'][:16]}..."
                )


def _npy_header(data: bytes, meta: Dict[str, Any]) -> Tuple[Optional[int], str]:
    """(header length, '') for a NumPy 1.0 header of a 1-D array of seqlen ids, else (None, why)."""
    if data[:8] != b"\x93NUMPY\x01\x00":
        return None, "npy magic/version is not NumPy format 1.0"
    hlen = 10 + int.from_bytes(data[8:10], "little")
    try:
        f = io.BytesIO(data[:hlen])
        np.lib.format.read_magic(f)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    except Exception as e:
        return None, f"npy header unreadable ({type(e).__name__}: {e})"
    want = DTYPES[meta["dtype"]]
    if shape != (meta["seqlen"],) or fortran or dtype != want:
        return None, f"npy header says shape {shape} dtype {dtype}, expected ({meta['seqlen']},) {want}"
    return hlen, ""


def _check_npy_shard(
    f, name: str, size: int, meta: Dict[str, Any], k: int, n: int, header: Dict[str, bytes], report: VerifyReport
) -> bool:
    seqlen, dtype, vocab = meta["seqlen"], DTYPES[meta["dtype"]], meta["tokenizer"]["vocab_size"]
    first = f.read(TAR_BLOCK + 1024)
    if len(first) < TAR_BLOCK + 10:
        report.problem(f"{name}: {size} bytes, too short for one member")
        return False
    problem = _check_tar_header(first[:TAR_BLOCK], f"{k:08d}_{0:08d}.npy")
    if problem:
        report.problem(f"{name}: member 0: {problem}")
        return False
    hlen, why = _npy_header(first[TAR_BLOCK:], meta)
    if hlen is None:
        report.problem(f"{name}: member 0: {why}")
        return False
    npy = first[TAR_BLOCK : TAR_BLOCK + hlen]
    if header.setdefault("npy", npy) != npy:
        report.problem(f"{name}: npy header differs from the first shard's")
        return False
    payload = hlen + seqlen * dtype.itemsize
    stride = TAR_BLOCK + -(-payload // TAR_BLOCK) * TAR_BLOCK
    if _parse_octal(first[124:136]) != payload:
        report.problem(f"{name}: member 0: tar size {_parse_octal(first[124:136])}, expected {payload}")
        return False
    expected = n * stride + 2 * TAR_BLOCK
    if size != expected:
        report.problem(f"{name}: {size} bytes, {n} members of {stride} bytes make {expected}")
        return False
    mm = np.memmap(f, dtype=np.uint8, mode="r", shape=(size,))
    try:
        if mm[n * stride :].any():
            report.problem(f"{name}: the tar trailer (two zero blocks) is not zero")
            return False
        rows = mm[: n * stride].reshape(n, stride)
        tar0 = np.frombuffer(first[:TAR_BLOCK], dtype=np.uint8)
        npy0 = np.frombuffer(npy, dtype=np.uint8)
        fixed = np.r_[100:148, 156:TAR_BLOCK]  # everything but the name and the checksum
        for start in range(0, n, ROWS_PER_BLOCK):
            block = rows[start : start + ROWS_PER_BLOCK]
            m = len(block)
            heads = np.asarray(block[:, :TAR_BLOCK])
            bad = np.flatnonzero((heads[:, fixed] != tar0[fixed]).any(axis=1))
            if bad.size:
                report.problem(
                    f"{name}: member {start + bad[0]}: tar header differs from member 0's (size, mode, type...)"
                )
                return False
            names = np.frombuffer(
                b"".join(f"{k:08d}_{i:08d}.npy".encode().ljust(100, b"\0") for i in range(start, start + m)),
                dtype=np.uint8,
            ).reshape(m, 100)
            bad = np.flatnonzero((heads[:, :100] != names).any(axis=1))
            if bad.size:
                got = bytes(heads[bad[0], :100]).split(b"\0", 1)[0]
                report.problem(
                    f"{name}: member {start + bad[0]}: name {got[:40]!r}, expected {k:08d}_{start + bad[0]:08d}.npy"
                )
                return False
            computed = heads[:, :148].sum(axis=1, dtype=np.int64) + heads[:, 156:].sum(axis=1, dtype=np.int64) + 8 * 32
            for i in range(m):
                if _parse_octal(bytes(heads[i, 148:156])) != computed[i]:
                    report.problem(f"{name}: member {start + i}: tar header checksum is wrong")
                    return False
            bad = np.flatnonzero((block[:, TAR_BLOCK : TAR_BLOCK + hlen] != npy0).any(axis=1))
            if bad.size:
                report.problem(f"{name}: member {start + bad[0]}: npy header differs from member 0's")
                return False
            if np.asarray(block[:, TAR_BLOCK + payload :]).any():
                i = int(np.flatnonzero(np.asarray(block[:, TAR_BLOCK + payload :]).any(axis=1))[0])
                report.problem(f"{name}: member {start + i}: padding after the ids is not zero")
                return False
            ids = block[:, TAR_BLOCK + hlen : TAR_BLOCK + payload].view(dtype)
            top = ids.max(axis=1)
            bad = np.flatnonzero(top >= vocab)
            if bad.size:
                i = int(bad[0])
                report.problem(f"{name}: member {start + i}: id {int(top[i])} >= vocab size {vocab}")
                return False
    finally:
        del mm
    return True


def _id_list(text: bytes) -> Optional[np.ndarray]:
    """The non-negative integers of a JSON list like ``[1,2,3]``, or None for anything else.

    The text is checked to be digits separated by single commas (whitespace allowed between
    tokens), then read by NumPy's C parser: several times faster than json.loads plus a type
    check per element. A number too long for int64 saturates (strtoll), so it is >= vocab."""
    if len(text) < 2 or text[:1] != b"[" or text[-1:] != b"]":
        return None
    inner = text[1:-1]
    if inner.translate(None, b"0123456789,"):
        if inner.translate(None, b"0123456789, \t\r\n") or _SPACED_DIGITS.search(inner):
            return None
        inner = inner.translate(None, b" \t\r\n")
    if not inner or inner[:1] == b"," or inner[-1:] == b"," or b",," in inner:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            ids = np.fromstring(inner, dtype=np.int64, sep=",")
        except (ValueError, DeprecationWarning):
            return None
    return ids if len(ids) == inner.count(b",") + 1 else None


def _next_member(f, name: str, member: str, i: int, pos: int, size: int, report: VerifyReport) -> Optional[bytes]:
    """The data of the tar member at ``pos`` of shard ``name`` (opened as ``f``), which must be
    named ``member``; ``None`` (with the problem reported) if it is not a well-formed member.
    The caller advances ``pos`` by ``TAR_BLOCK`` plus the padded length."""
    head = f.read(TAR_BLOCK)
    if len(head) < TAR_BLOCK:
        report.problem(f"{name}: ends inside member {i} (truncated)")
        return None
    problem = _check_tar_header(head, member)
    if problem:
        report.problem(f"{name}: member {i}: {problem}")
        return None
    length = _parse_octal(head[124:136]) or 0
    padded = -(-length // TAR_BLOCK) * TAR_BLOCK
    if pos + TAR_BLOCK + padded > size:
        report.problem(f"{name}: member {i}: size {length} runs past the end of the file")
        return None
    data = f.read(padded)
    if any(data[length:]):
        report.problem(f"{name}: member {i}: padding after the data is not zero")
        return None
    return data[:length]


def _padded(length: int) -> int:
    return TAR_BLOCK + -(-length // TAR_BLOCK) * TAR_BLOCK


def _check_json_shard(f, name: str, size: int, meta: Dict[str, Any], k: int, n: int, report: VerifyReport) -> bool:
    seqlen, vocab = meta["seqlen"], meta["tokenizer"]["vocab_size"]
    # "[" + ids of at most 10 digits + commas + "]": anything longer is not ours (or a gzip bomb).
    max_json = 2 + seqlen * 11
    pos = 0
    for i in range(n):
        data = _next_member(f, name, f"{k:08d}_{i:08d}.json.gz", i, pos, size, report)
        if data is None:
            return False
        pos += _padded(len(data))
        try:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            text = d.decompress(data, max_json + 1)
            if len(text) > max_json or not d.eof or d.unused_data:
                raise ValueError("not a single gzip stream of one short JSON list")
        except (zlib.error, ValueError) as e:
            report.problem(f"{name}: member {i}: {e}")
            return False
        ids = _id_list(text)
        if ids is None or len(ids) != seqlen or ids.max() >= vocab:
            report.problem(f"{name}: member {i}: not a JSON list of {seqlen} ids in [0, {vocab})")
            return False
    trailer = f.read(2 * TAR_BLOCK + 1)
    if trailer != bytes(2 * TAR_BLOCK):
        report.problem(f"{name}: does not end with exactly two zero blocks after member {n - 1}")
        return False
    return True


# ------------------------------------------------------------------------------------------------
# Unpacked caches (packing "none"): bin_KK/ sub-caches of members of their own lengths, each
# shard with a .idx sidecar of member offsets (docs/format.md §4.2).


def _verify_unpacked(root: Path, meta: Dict[str, Any], full: bool, report: VerifyReport) -> None:
    bins = meta.get("bins")
    keys = ("max_len", "num_chunks", "num_examples", "num_tokens")
    if not (
        isinstance(bins, list)
        and 1 <= len(bins) <= 100
        and all(isinstance(b, dict) and all(_is_int(b.get(x)) and b[x] >= 0 for x in keys) for b in bins)
    ):
        report.problem(
            "tokshuf.json: bins is not a list of 1 to 100 objects with max_len, num_chunks, num_examples, num_tokens"
        )
        return
    bounds = [b["max_len"] for b in bins]
    if bounds[0] < 1 or any(a >= b for a, b in zip(bounds, bounds[1:])) or bounds[-1] != meta["seqlen"]:
        report.problem(f"tokshuf.json: bin bounds {bounds} are not increasing up to seqlen {meta['seqlen']}")
        return
    for key, total in (("num_chunks", "num_chunks"), ("num_examples", "num_contexts"), ("num_tokens", "num_tokens")):
        got = sum(b[key] for b in bins)
        if got != meta[total]:
            report.problem(f"tokshuf.json: the bins' {key} add up to {got}, {total} is {meta[total]}")
    names = {f"bin_{k:02d}" for k in range(len(bins))}
    extra = sorted(n for n in os.listdir(root) if n not in names | {"tokshuf.json"})
    if extra:
        report.warnings.append(f"{len(extra)} other entries in the folder: {', '.join(extra[:5])}")
    for k, b in enumerate(bins):
        where = f"bin_{k:02d}/"
        sub = root / f"bin_{k:02d}"
        if not sub.is_dir():
            report.problem(f"{where}: missing")
            continue
        bin_meta = dict(meta, seqlen=b["max_len"], num_chunks=b["num_chunks"], num_contexts=b["num_examples"])
        bin_meta.update(num_tokens=b["num_tokens"], chunk_sizes=None)
        own = VerifyReport(path=str(sub), full=full)
        manifest = _check_manifest(sub, bin_meta, own)
        if manifest is not None:
            _check_folder(sub, manifest, own, sidecars=True)
            lo = bounds[k - 1] if k else 0
            for c, line in enumerate(manifest):
                _check_ragged_shard(sub, bin_meta, lo, c, line, full, own)
        for text in own.problems:
            report.problem(where + text)
        report.omitted += own.omitted
        report.warnings.extend(where + w for w in own.warnings)
        report.num_shards += own.num_shards
        report.num_contexts += own.num_contexts
        report.num_bytes += own.num_bytes


def _check_ragged_shard(
    root: Path, meta: Dict[str, Any], lo: int, k: int, line: Dict[str, Any], full: bool, report: VerifyReport
) -> None:
    """One shard of a bin: members in order at the offsets its .idx sidecar lists, each a 1-D
    npy array of lo < length <= the bin's bound, ids below the vocabulary size."""
    name, n = f"{line['shard']}.tar", line["num_sequences"]
    hi, dtype, vocab = meta["seqlen"], DTYPES[meta["dtype"]], meta["tokenizer"]["vocab_size"]
    try:
        data = (root / name).read_bytes() if (root / name).is_file() else None
        idx_bytes = (root / f"{line['shard']}.idx").read_bytes()
    except OSError as e:
        report.problem(f"{name}: cannot read it or its .idx ({e})")
        return
    if data is None:
        report.problem(f"{name}: missing or not a regular file")
        return
    size = len(data)
    if "bytes" in line and size != line["bytes"]:
        report.problem(f"{name}: {size} bytes, manifest says {line['bytes']}")
        return
    report.num_shards += 1
    report.num_bytes += size
    if len(idx_bytes) != 8 * (n + 1):
        report.problem(f"{line['shard']}.idx: {len(idx_bytes)} bytes, expected {8 * (n + 1)} for {n} members")
        return
    offsets = np.frombuffer(idx_bytes, dtype="<u8").tolist()
    pos, tokens = 0, 0
    for i in range(n):
        if offsets[i] != pos:
            report.problem(f"{line['shard']}.idx: offset {i} is {offsets[i]}, member {i} starts at {pos}")
            return
        head = data[pos : pos + TAR_BLOCK]
        problem = _check_tar_header(head, f"{k:08d}_{i:08d}.npy") if len(head) == TAR_BLOCK else "truncated"
        if problem:
            report.problem(f"{name}: member {i}: {problem}")
            return
        length = _parse_octal(head[124:136]) or 0
        body = data[pos + TAR_BLOCK : pos + TAR_BLOCK + -(-length // TAR_BLOCK) * TAR_BLOCK]
        if len(body) < length:
            report.problem(f"{name}: member {i}: size {length} runs past the end of the file")
            return
        try:
            f = io.BytesIO(body[:length])
            if np.lib.format.read_magic(f) != (1, 0):
                raise ValueError("not NumPy format 1.0")
            shape, fortran, dt = np.lib.format.read_array_header_1_0(f)
        except Exception as e:
            report.problem(f"{name}: member {i}: npy header unreadable ({e})")
            return
        ids_at = f.tell()
        if (
            len(shape) != 1
            or fortran
            or dt != dtype
            or not lo < shape[0] <= hi
            or length - ids_at != shape[0] * dtype.itemsize
        ):
            report.problem(f"{name}: member {i}: shape {shape} dtype {dt}, expected 1-D {dtype} of {lo + 1}..{hi} ids")
            return
        if any(body[length:]):
            report.problem(f"{name}: member {i}: padding after the ids is not zero")
            return
        ids = np.frombuffer(body[ids_at:length], dtype=dtype)
        if ids.max() >= vocab:
            report.problem(f"{name}: member {i}: id {int(ids.max())} >= vocab size {vocab}")
            return
        tokens += shape[0]
        pos += TAR_BLOCK + len(body)
    if offsets[n] != pos:
        report.problem(f"{line['shard']}.idx: last offset {offsets[n]}, the members end at {pos}")
        return
    if data[pos:] != bytes(2 * TAR_BLOCK):
        report.problem(f"{name}: does not end with exactly two zero blocks after member {n - 1}")
        return
    if "num_tokens" in line and line["num_tokens"] != tokens:
        report.problem(f"{name}: {tokens} ids, manifest says num_tokens {line['num_tokens']}")
        return
    report.num_contexts += n
    if full and "sha256" in line and hashlib.sha256(data).hexdigest() != line["sha256"]:
        report.problem(f"{name}: sha256 differs from the manifest's")


def _check_blocks_shard(f, name: str, size: int, meta: Dict[str, Any], k: int, n: int, report: VerifyReport) -> bool:
    """A shard of 2-D npy members of ``block_size`` contexts (the last may hold fewer), each
    zstd-compressed for ``blocks.zst``; members are walked one after the other."""
    seqlen, dtype, vocab = meta["seqlen"], DTYPES[meta["dtype"]], meta["tokenizer"]["vocab_size"]
    block, zst = meta["block_size"], meta["format"] == "blocks.zst"
    pos = 0
    for b, start in enumerate(range(0, n, block)):
        rows = min(block, n - start)
        member = f"{k:08d}_{b:08d}.npy" + (".zst" if zst else "")
        raw = _next_member(f, name, member, b, pos, size, report)
        if raw is None:
            return False
        pos += _padded(len(raw))
        array_bytes = 256 + rows * seqlen * dtype.itemsize  # an npy header is far below 256 bytes
        if zst:
            import zstandard

            try:
                raw = zstandard.ZstdDecompressor().decompress(raw, max_output_size=array_bytes)
            except zstandard.ZstdError as e:
                report.problem(f"{name}: member {b}: not a zstd frame of one block ({e})")
                return False
        try:
            buf = io.BytesIO(raw)
            np.lib.format.read_magic(buf)
            shape, fortran, got = np.lib.format.read_array_header_1_0(buf)
        except Exception as e:
            report.problem(f"{name}: member {b}: npy header unreadable ({type(e).__name__}: {e})")
            return False
        if shape != (rows, seqlen) or fortran or got != dtype:
            report.problem(
                f"{name}: member {b}: npy header says shape {shape} dtype {got}, expected ({rows}, {seqlen}) {dtype}"
            )
            return False
        ids = np.frombuffer(raw, dtype=dtype, offset=buf.tell())
        if ids.size != rows * seqlen:
            report.problem(f"{name}: member {b}: {ids.size} ids after the npy header, expected {rows * seqlen}")
            return False
        if ids.size and int(ids.max()) >= vocab:
            report.problem(f"{name}: member {b}: id {int(ids.max())} >= vocab size {vocab}")
            return False
    trailer = f.read(2 * TAR_BLOCK + 1)
    if trailer != bytes(2 * TAR_BLOCK):
        report.problem(f"{name}: does not end with exactly two zero blocks after its last member")
        return False
    return True
