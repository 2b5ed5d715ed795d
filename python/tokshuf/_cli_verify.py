"""``python -m tokshuf verify CACHE [--full]``: check a cache; exit 0 if sound, 1 if not."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="check a cache against its metadata (sizes, tar layout, ids, counts; --full: sha256)",
        description="Check a cache: tokshuf.json, manifest.jsonl, every shard's size and tar layout, "
        "every id below the vocabulary size, and the counts. Exit status 0 when the cache is sound, "
        "1 when it is not.",
    )
    p.add_argument("cache", help="cache folder or URL (s3://, gs://, az://)")
    p.add_argument("--full", action="store_true", help="also compare every shard's sha256 with the manifest")
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="print only the problems, one a line (nothing when the cache is sound)",
    )
    p.set_defaults(func=_cmd_verify)


def _cmd_verify(args: argparse.Namespace) -> int:
    from ._verify import verify

    report = verify(args.cache, full=args.full)
    if not args.quiet:
        print(report.summary())
    else:
        for p in report.problems:
            print(p)
        if report.omitted:
            print(f"... and {report.omitted} more")
    return 0 if report.ok else 1
