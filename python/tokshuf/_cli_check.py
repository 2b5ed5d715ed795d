"""``python -m tokshuf check-tokenizer TOKENIZER CORPUS``: the fast tokenizer backend against
the reference library, document by document, with both speeds.

The reference is the Python library the ids are defined by (``tiktoken`` ``encode_ordinary``,
``tokenizers`` ``encode(..., add_special_tokens=False)`` with ``encode_special_tokens``) when it
is installed, else tokshuf's own reference backend. Exit status: 0 all equal, 1 some differ
(or an error), 2 the fast backend cannot be used for this tokenizer.
"""

from __future__ import annotations

import argparse
import gzip
import io
import sys
import time
from collections import Counter
from typing import Callable, Iterator, List, Optional, Tuple

from . import _core
from ._cli_types import count
from .exceptions import ConfigError, InputError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check-tokenizer",
        help="compare the fast tokenizer backend with the reference library on a corpus",
        description=__doc__.split("\n\n")[0].replace("``", ""),
        epilog="Exit status, as cmp's: 0 all equal, 1 some differ, 2 no comparison made (an error: say, the "
        "corpus is missing or the fast backend cannot serve this tokenizer).",
    )
    p.add_argument("tokenizer", help="tokenizer spec, as for build --tokenizer")
    p.add_argument("corpus", nargs="+", help="jsonl(.gz/.zst) files, directories or globs")
    p.add_argument("--limit", type=count, default=None, metavar="N", help="check the first N documents only")
    p.add_argument("--text-key", default="text", help="JSON key of the document text (default text)")
    p.add_argument(
        "--reference",
        choices=["auto", "python", "tokshuf"],
        default="auto",
        help="reference: the Python library (python), tokshuf's reference backend "
        "(tokshuf), or the Python library when installed (auto, default)",
    )
    p.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="special-token strings in text become control ids (tokenizer.json only)",
    )
    p.add_argument("--show", type=count, default=3, metavar="K", help="print the first K differences (default 3)")
    p.set_defaults(func=_cmd, error_code=2)


def _open(path: str) -> io.BufferedIOBase:
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith((".zst", ".zstd")):
        try:
            import zstandard
        except ImportError as e:
            raise InputError(f"{path}: reading .zst needs the zstandard package") from e
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")))
    return open(path, "rb")


def _stream_errors() -> Tuple[type, ...]:
    """What reading a damaged .gz (OSError, EOFError) or .zst stream raises."""
    try:
        import zstandard

        return (OSError, EOFError, zstandard.ZstdError)
    except ImportError:
        return (OSError, EOFError)


def read_documents(
    paths: List[str], key: str, limit: Optional[int], bad: Optional[Counter] = None
) -> Iterator[Tuple[str, str]]:
    """(where, text) of the documents a build tokenizes (lines parsed by the builder's own
    parser; blank, bad and empty ones are skipped, the bad ones counted in ``bad``, the first
    of them by its location and reason), in order.
    A stream that cannot be decoded is an ``InputError`` naming the line, as in a build."""
    n = 0
    for path in paths:
        line_no = 0
        try:
            with _open(path) as f:
                for line_no, line in enumerate(f, 1):
                    if limit is not None and n >= limit:
                        return
                    kind, text = _core.parse_line(line[:-1] if line.endswith(b"\n") else line, key)
                    if kind == "text" and text:
                        n += 1
                        yield f"{path}:{line_no}", text
                    elif kind not in ("text", "blank") and bad is not None:
                        bad[f"{path}:{line_no}: {text}" if not bad else "others"] += 1
        except _stream_errors() as e:
            raise InputError(f"{path}:{line_no + 1}: cannot decompress or read: {e}") from e


def _tiktoken_encoding(name: str):
    """tiktoken's own Encoding, built from the ranks tokshuf embeds (never downloads)."""
    import base64

    import tiktoken
    import tiktoken_ext.openai_public as public

    ranks = {}
    for line in _core._tiktoken_data(name).splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    original = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        params = public.ENCODING_CONSTRUCTORS[name]()
    finally:
        public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


def python_reference(spec: str, allow_special: bool) -> Tuple[str, Callable[[str], List[int]]]:
    """(name, encode) of the Python reference library; ImportError if it is not installed."""
    if spec.startswith("tiktoken:"):
        name = spec.split(":", 1)[1]
        # tiktoken's "gpt2" has r50k_base's ranks, but its constructor downloads them.
        enc = _tiktoken_encoding("r50k_base" if name == "gpt2" else name)
        import tiktoken

        return f"tiktoken {tiktoken.__version__} encode_ordinary", enc.encode_ordinary
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(_core._tokenizer_json_path(spec))
    tok.encode_special_tokens = not allow_special
    # A build ignores the file's truncation and padding: it keeps every id of a document.
    tok.no_truncation()
    tok.no_padding()
    return (
        f"tokenizers {tokenizers.__version__} encode(add_special_tokens=False)",
        lambda text: tok.encode(text, add_special_tokens=False).ids,
    )


def _timed(encode: Callable[[str], List[int]], texts: List[str]) -> Tuple[List[List[int]], float]:
    t0 = time.perf_counter()
    ids = [encode(t) for t in texts]
    return ids, time.perf_counter() - t0


def _describe(tok, where: str, text: str, got: List[int], want: List[int]) -> str:
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    before = tok.decode(want[max(0, k - 8) : k])
    piece = lambda ids: ", ".join(f"{i} {tok.decode([i])!r}" for i in ids[k : k + 6])  # noqa: E731
    return (
        f"  {where}: {len(got)} vs {len(want)} ids, first difference at id {k}\n"
        f"    after     ...{before[-60:]!r}\n"
        f"    fast      [{piece(got)}]\n"
        f"    reference [{piece(want)}]"
    )


def _cmd(args: argparse.Namespace) -> int:
    from ._inputs import expand_inputs

    fast = _core.Tokenizer(args.tokenizer, allow_special_tokens=args.allow_special_tokens, backend="fast")
    name, ref_encode = None, None
    if args.reference in ("auto", "python"):
        try:
            name, ref_encode = python_reference(args.tokenizer, args.allow_special_tokens)
        except ImportError as e:
            if args.reference == "python":
                raise ConfigError("--reference python: the tiktoken / tokenizers package is not installed") from e
    if ref_encode is None:
        ref = _core.Tokenizer(args.tokenizer, allow_special_tokens=args.allow_special_tokens, backend="reference")
        name, ref_encode = f"tokshuf {ref.backend} (reference backend)", ref.encode

    # In batches, so that a whole corpus never sits in memory as Python lists of ids.
    ndocs = nbytes = nids = 0
    t_fast = t_ref = 0.0
    differ: List[str] = []
    batch: List[Tuple[str, str]] = []
    batch_bytes = 0

    def check(batch: List[Tuple[str, str]]) -> None:
        nonlocal t_fast, t_ref, nids
        texts = [t for _, t in batch]
        # The fast backend encodes warm: its per-thread memo is what makes it fast on a corpus.
        got, dt = _timed(fast.encode, texts)
        t_fast += dt
        want, dt = _timed(ref_encode, texts)
        t_ref += dt
        nids += sum(map(len, want))
        for (where, text), g, w in zip(batch, got, want):
            if g != w:
                if len(differ) < args.show:
                    print(_describe(fast, where, text, g, w), file=sys.stderr)
                differ.append(where)

    bad: Counter = Counter()
    for where, text in read_documents(expand_inputs(args.corpus), args.text_key, args.limit, bad):
        batch.append((where, text))
        size = len(text.encode("utf-8"))
        batch_bytes += size
        ndocs += 1
        nbytes += size
        if batch_bytes >= 8 << 20:
            check(batch)
            batch, batch_bytes = [], 0
    if batch:
        check(batch)
    if ndocs == 0:
        why = f"; {sum(bad.values()):,} bad lines, the first {next(iter(bad))}" if bad else ""
        raise InputError(f"{', '.join(args.corpus)}: no documents to compare{why}")

    print(f"{args.tokenizer}: {ndocs:,} documents, {nbytes / 1e6:,.1f} MB of text, {nids:,} reference ids")
    print(f"  fast      {fast.backend}: {nbytes / 1e6 / max(t_fast, 1e-9):.1f} MB/s (one thread)")
    print(f"  reference {name}: {nbytes / 1e6 / max(t_ref, 1e-9):.1f} MB/s (one thread)")
    if bad:
        print(
            f"  skipped   {sum(bad.values()):,} bad lines (a build raises or skips them), the first {next(iter(bad))}"
        )
    print(
        f"  {len(differ):,} differ"
        + (
            f" (first shown above; all: {', '.join(differ[:20])}{' ...' if len(differ) > 20 else ''})"
            if differ
            else " (ids identical)"
        )
    )
    return 1 if differ else 0
