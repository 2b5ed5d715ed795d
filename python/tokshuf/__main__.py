"""Command line: ``python -m tokshuf COMMAND`` (also installed as ``tokshuf``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from . import _cli_blend, _cli_check, _cli_read, _cli_status, _cli_verify
from .exceptions import TokshufError


def _parse_size(text: str) -> int:
    """A byte count: 8G, 512M, 1.5GiB, 4096."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().rstrip("ib").rstrip("b") if text[-1:].lower() == "b" else text.strip().lower()
    try:
        n = int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)
    except ValueError:
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with K, M, G or T (e.g. 8G)")
    return n


def _parse_bins(text: str) -> List[int]:
    """Bin bounds: 256,512,1024,2049."""
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers (e.g. 512,1024,2049)"
        ) from None


def _add_build(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ._build import DEFAULT_TOKENIZER

    p = sub.add_parser(
        "build",
        help="tokenize jsonl(.gz/.zst) files into a shuffled WebDataset cache",
        description="Tokenize jsonl(.gz/.zst) files into a shuffled WebDataset cache. Running the "
        "same command again resumes an interrupted build.",
    )
    p.add_argument(
        "--input",
        "-i",
        action="append",
        required=True,
        metavar="PATH",
        help="input file, directory (searched recursively) or glob; repeatable",
    )
    p.add_argument("--output", "-o", required=True, help="cache folder to create (or resume)")
    p.add_argument(
        "--tokenizer",
        default=DEFAULT_TOKENIZER,
        help="tiktoken:{r50k,p50k,cl100k,o200k}_base, a tokenizer.json (or its folder), "
        f"or hf:ORG/NAME from the local Hugging Face cache (default {DEFAULT_TOKENIZER})",
    )
    p.add_argument("--seqlen", type=int, default=2049, help="ids per context (default 2049)")
    p.add_argument(
        "--wds-chunk-size",
        "--chunk-size",
        dest="chunk_size",
        type=int,
        default=8192,
        help="contexts per output tar (default 8192)",
    )
    p.add_argument(
        "--num-local-cells", type=int, default=None, help="number of shuffle cells (default: one per 65,536 contexts)"
    )
    p.add_argument(
        "--local-cell-dir", default=None, help="scratch folder for stage-1 spills (default: inside the output folder)"
    )
    p.add_argument("--threads", type=int, default=None, help="worker threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    p.add_argument("--text-key", default="text", help="JSON key of the document text (default text)")
    p.add_argument("--format", choices=["npy", "json.gz"], default="npy", help="tar member format")
    p.add_argument(
        "--tail",
        choices=["stitch", "pad", "drop"],
        default="stitch",
        help="what to do with each file's last partial context (default stitch)",
    )
    p.add_argument("--eot-id", type=int, default=None, help="end-of-text id (default: the tokenizer's)")
    p.add_argument("--pad-id", type=int, default=None, help="padding id (default: the tokenizer's, else EOT)")
    p.add_argument("--bos", action="store_true", help="start every document with a BOS id")
    p.add_argument("--bos-id", type=int, default=None, help="BOS id (default: the tokenizer's)")
    p.add_argument(
        "--tokenizer-backend",
        choices=["auto", "fast", "reference"],
        default="auto",
        help="tokenizer implementation: fast where exact (auto, default), or force one; ids are identical",
    )
    p.add_argument(
        "--allow-special-tokens",
        action="store_true",
        help="let special-token strings in text become control ids (tokenizer.json only)",
    )
    p.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        help="no shuffle: chunks per input file, round-robin over files",
    )
    p.add_argument(
        "--memory-limit", type=_parse_size, default=None, help="memory budget, e.g. 8G (default: half of RAM)"
    )
    p.add_argument(
        "--errors",
        choices=["raise", "skip"],
        default="raise",
        help="bad input lines: stop with their location, or skip and count them",
    )
    p.add_argument(
        "--packing",
        choices=["concat", "bestfit", "none"],
        default="concat",
        help="concat: documents run together, cut every seqlen ids (default); bestfit: documents "
        "placed whole into padded contexts (only those longer than seqlen are split); none: every "
        "document is an example of its own length, stored in length bins",
    )
    p.add_argument(
        "--pack-window", type=int, default=None, help="documents per best-fit window (bestfit only; default 1024)"
    )
    p.add_argument(
        "--bins",
        type=_parse_bins,
        default=None,
        metavar="B1,B2,...",
        help="packing none: the length bins' upper bounds, ascending, the last one seqlen",
    )
    p.add_argument(
        "--bin-size",
        type=int,
        default=None,
        help="packing none: equal-width length bins of this many ids (default: seqlen / 16, rounded up)",
    )
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="run on this machine (default) or as tasks on a Ray cluster (docs/distributed.md)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --engine ray: the cluster to join (default auto: the running one, else a local one)",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="discard an existing build in the output folder and start over"
    )
    p.set_defaults(func=_cmd_build)


def _cmd_build(args: argparse.Namespace) -> int:
    from ._build import run_build

    stats = run_build(
        args.input,
        args.output,
        tokenizer=args.tokenizer,
        seqlen=args.seqlen,
        chunk_size=args.chunk_size,
        num_local_cells=args.num_local_cells,
        local_cell_dir=args.local_cell_dir,
        seed=args.seed,
        threads=args.threads,
        text_key=args.text_key,
        format=args.format,
        tail=args.tail,
        eot_id=args.eot_id,
        pad_id=args.pad_id,
        bos=args.bos,
        bos_id=args.bos_id,
        allow_special_tokens=args.allow_special_tokens,
        shuffle=args.shuffle,
        memory_limit=args.memory_limit,
        errors=args.errors,
        progress=args.progress,
        overwrite=args.overwrite,
        tokenizer_backend=args.tokenizer_backend,
        packing=args.packing,
        pack_window=args.pack_window,
        bins=args.bins,
        bin_size=args.bin_size,
        engine=args.engine,
        ray_address=args.ray_address,
    )
    print(stats.summary())
    return 0


DESCRIPTION = """Tokenize jsonl corpora into shuffled WebDataset caches, and read them back in a
deterministic order. Run 'tokshuf COMMAND --help' for the options of a command."""


def make_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="tokshuf", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tokshuf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_build(sub)
    _cli_blend.add_parser(sub)
    _cli_read.add_parser(sub)
    _cli_status.add_parser(sub)
    _cli_verify.add_parser(sub)
    _cli_check.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    debug = bool(os.environ.get("TOKSHUF_DEBUG"))
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader of our output (say `| head`) has had enough: not an error. Later writes
        # (and the interpreter's final flush) go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except TokshufError as e:
        if debug:
            raise
        print(f"\ntokshuf: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        print("\ntokshuf: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
