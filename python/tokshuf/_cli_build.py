"""CLI: ``tokshuf build``. Its flags are tokshuf-rs's (DCLM), so a tokshuf-rs command runs
unchanged (docs/tokshuf-rs.md says what each of its flags means here), plus tokshuf's own."""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

from . import _dclm
from ._cli_types import parse_size
from ._remote import is_url
from .exceptions import ConfigError


def parse_bins(text: str) -> List[int]:
    """Bin bounds: 256,512,1024,2049."""
    try:
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers (e.g. 512,1024,2049)"
        ) from None


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from ._build import DEFAULT_TOKENIZER

    p = sub.add_parser(
        "build",
        help="tokenize jsonl(.gz/.zst) files into a shuffled WebDataset cache",
        description="Tokenize jsonl(.gz/.zst) files into a shuffled WebDataset cache (or, with "
        "--shuffle-only, shuffle the contexts of existing tar shards again). Running the same "
        "command again resumes an interrupted build. The flags of DCLM's tokshuf-rs are "
        "accepted as they are; --dclm-compat also takes its output conventions.",
    )
    p.add_argument(
        "--input",
        "-i",
        action="append",
        required=True,
        metavar="PATH",
        help="input file, directory (searched recursively) or glob, or s3:// (gs://, az://) URL; repeatable",
    )
    p.add_argument("--output", "-o", required=True, help="cache folder to create (or resume), or an object-store URL")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tiktoken:{r50k,p50k,cl100k,o200k}_base, a tokenizer.json (or its folder), or ORG/NAME "
        "(also hf:ORG/NAME) from the local Hugging Face cache, never downloaded "
        f"(default {DEFAULT_TOKENIZER}; with --dclm-compat {_dclm.DCLM_TOKENIZER})",
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
    p.add_argument("--threads", type=int, default=None, help="worker threads (default, or 0: all cores)")
    p.add_argument("--seed", type=int, default=None, help="shuffle seed (default 0; with --dclm-compat 1234)")
    p.add_argument("--text-key", default="text", help="JSON key of the document text (default text)")
    p.add_argument(
        "--format",
        choices=["npy", "json.gz", "blocks", "blocks.zst"],
        default=None,
        help="tar member format: npy (one context a member, default), json.gz (open_lm; the default with "
        "--dclm-compat), blocks (2-D npy arrays of --block-size contexts), blocks.zst (those, zstd-compressed); "
        "see docs/format.md",
    )
    p.add_argument("--block-size", type=int, default=None, help="contexts per member of the block formats (default 64)")
    p.add_argument(
        "--tail",
        choices=["stitch", "pad", "drop"],
        default=None,
        help="what to do with each file's last partial context (default stitch; with --dclm-compat pad); "
        "--packing concat only: the other packings and --shuffle-only have no tails, and record stitch",
    )
    p.add_argument(
        "--eot-id",
        type=int,
        default=None,
        help="end-of-text id (default: the tokenizer's; with --dclm-compat tokshuf-rs's 0 for its tokenizers)",
    )
    p.add_argument(
        "--pad-id",
        type=int,
        default=None,
        help="padding id (default: the tokenizer's, else EOT; with --dclm-compat tokshuf-rs's for its tokenizers)",
    )
    p.add_argument("--bos", action="store_true", help="start every document with a BOS id")
    p.add_argument("--bos-id", type=int, default=None, help="BOS id (default: the tokenizer's)")
    p.add_argument(
        "--tokenizer-backend",
        choices=["auto", "fast", "reference"],
        default=None,
        help="tokenizer implementation: fast where exact (auto, default), or force one; ids are identical",
    )
    p.add_argument(
        "--allow-special-tokens",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let special-token strings in text become control ids (tokenizer.json only; default no, "
        "with --dclm-compat yes unless --use-tiktoken, as tokshuf-rs encodes)",
    )
    p.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        help="no shuffle: chunks per input file, round-robin over files",
    )
    p.add_argument(
        "--memory-limit",
        type=parse_size,
        default=None,
        help="bound on the memory that grows with the input, e.g. 1G (default: half of RAM; docs/building.md, 'Large builds')",
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
        type=parse_bins,
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
    g = p.add_argument_group(
        "tokshuf-rs (DCLM) compatibility",
        "tokshuf-rs's own flags, with what they mean here (docs/tokshuf-rs.md).",
    )
    g.add_argument(
        "--dclm-compat",
        action="store_true",
        help="tokshuf-rs's output conventions: json.gz members, seed 1234, each file's last context "
        "padded, EOT 0 and padding id 50256 for EleutherAI/gpt-neox-20b (its default tokenizer), "
        "special-token strings in text encoded as control ids; any flag given explicitly wins",
    )
    g.add_argument(
        "--shuffle-only",
        action="store_true",
        help="inputs are tar shards of contexts (a tokshuf cache's or tokshuf-rs's .npy or .json.gz "
        "members), shuffled again into a new cache exactly as a build shuffles; directories are "
        "searched for .tar files; --tokenizer and --seqlen must be those the shards were made with",
    )
    g.add_argument(
        "--use-tiktoken",
        action="store_true",
        help="tokshuf-rs's faster tokenizer path; here the fast backend (--tokenizer-backend fast), "
        "which auto already picks wherever it is exact: the Hugging Face ids exactly (tokshuf-rs's "
        "tiktoken path differs on runs of whitespace), an error where it cannot be exact",
    )
    g.add_argument(
        "--ext",
        default=None,
        metavar="EXT",
        help="input directories are searched for files whose names end in .EXT (e.g. jsonl.zstd; "
        "default .jsonl, .jsonl.gz, .jsonl.zst, .jsonl.zstd; with --shuffle-only .tar)",
    )
    g.add_argument(
        "--s3-retries",
        type=int,
        default=None,
        metavar="N",
        help="retries of each object-store request (s3://, gs://, az://) before giving up, here and "
        "on the Ray engine's workers (default 10, or TOKSHUF_REMOTE_RETRIES)",
    )
    g.add_argument(
        "--input-json",
        default=None,
        metavar="PATH",
        help="a DCLM dataset record (exp_data/datasets/...json) to rewrite for this cache, with --output-json",
    )
    g.add_argument(
        "--output-json",
        default=None,
        metavar="PATH",
        help="where the rewritten record goes: dataset_url and manifest_url set to the cache, "
        "tokenized true, and tokenizer, num_tokens and size filled in where the record lacks them",
    )
    p.set_defaults(func=run)


def build_options(args: argparse.Namespace) -> Dict[str, Any]:
    """The options of ``build_cache`` the command line asks for, tokshuf-rs's flags resolved."""
    from ._build import DEFAULT_TOKENIZER

    if (args.input_json is None) != (args.output_json is None):
        raise ConfigError("--input-json and --output-json go together (the record read, and where it is written)")
    out = args.output_json
    # Checked now, not found out after the build.
    if (
        out is not None
        and not is_url(out)
        and (not out or os.path.isdir(out) or not os.path.isdir(os.path.dirname(os.path.abspath(out))))
    ):
        raise ConfigError(f"--output-json {out!r}: not a file name in an existing folder")
    if out is not None and args.packing == "none":
        # A DCLM record names one manifest of fixed-length contexts; an unpacked cache has
        # neither (its manifests are per length bin).
        raise ConfigError(
            "--output-json records a cache of contexts for DCLM; --packing none makes examples of any length"
        )
    if out is not None and not is_url(args.output):
        try:
            os.fsencode(args.output).decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(
                f"--output-json records the cache's path as JSON text: {args.output!r} is not UTF-8"
            ) from None
    if args.s3_retries is not None and args.s3_retries < 0:
        raise ConfigError(f"--s3-retries must be >= 0, not {args.s3_retries}")
    backend = args.tokenizer_backend
    if args.use_tiktoken:
        if backend not in (None, "fast"):
            raise ConfigError(f"--use-tiktoken asks for the fast backend; it contradicts --tokenizer-backend {backend}")
        backend = "fast"
    compat = args.dclm_compat
    tokenizer = args.tokenizer or (_dclm.DCLM_TOKENIZER if compat else DEFAULT_TOKENIZER)
    conv = _dclm.conventions(tokenizer, args.use_tiktoken) if compat else None

    def pick(given: Any, field: str, default: Any) -> Any:
        """The flag's value if given, else tokshuf-rs's convention (with --dclm-compat), else ours."""
        if given is not None:
            return given
        convention = getattr(conv, field) if conv is not None else None
        return default if convention is None else convention

    bos_id = pick(args.bos_id, "bos_id", None)
    # tokshuf-rs's Hugging Face path encodes as plain `encode` does; its tiktoken path does not.
    hf_plain = compat and not args.use_tiktoken and not tokenizer.startswith("tiktoken:")
    return dict(
        tokenizer=tokenizer,
        seqlen=args.seqlen,
        chunk_size=args.chunk_size,
        num_local_cells=args.num_local_cells,
        local_cell_dir=args.local_cell_dir,
        seed=pick(args.seed, "seed", 0),
        threads=args.threads or None,  # tokshuf-rs's 0: all cores
        text_key=args.text_key,
        format=pick(args.format, "format", "npy"),
        tail=pick(args.tail, "tail", "stitch"),
        eot_id=pick(args.eot_id, "eot_id", None),
        pad_id=pick(args.pad_id, "pad_id", None),
        bos=args.bos or bos_id is not None,
        bos_id=bos_id,
        allow_special_tokens=hf_plain if args.allow_special_tokens is None else args.allow_special_tokens,
        shuffle=args.shuffle,
        memory_limit=args.memory_limit,
        errors=args.errors,
        progress=args.progress,
        overwrite=args.overwrite,
        tokenizer_backend=backend or "auto",
        packing=args.packing,
        pack_window=args.pack_window,
        bins=args.bins,
        bin_size=args.bin_size,
        block_size=args.block_size,
        engine=args.engine,
        ray_address=args.ray_address,
        shuffle_only=args.shuffle_only,
    )


def run(args: argparse.Namespace) -> int:
    from ._build import run_build

    options = build_options(args)
    record = _dclm.read_record(args.input_json) if args.input_json is not None else None
    if args.s3_retries is not None:
        # Read when this process first talks to a store (storage/client.rs).
        os.environ["TOKSHUF_REMOTE_RETRIES"] = str(args.s3_retries)
    stats = run_build(args.input, args.output, ext=args.ext, **options)
    if record is not None:
        _dclm.write_record(
            args.output_json, _dclm.update_record(record, args.output, options["tokenizer"], stats.metadata)
        )
    print(stats.summary())
    return 0
