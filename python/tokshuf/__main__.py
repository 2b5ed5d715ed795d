"""Command line: ``python -m tokshuf COMMAND`` (also installed as ``tokshuf``)."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from typing import List, Optional

from . import _cli_blend, _cli_build, _cli_check, _cli_read, _cli_status, _cli_verify
from .exceptions import TokshufError

DESCRIPTION = """Tokenize jsonl corpora into shuffled WebDataset caches, and read them back in a
deterministic order. Run 'tokshuf COMMAND --help' for the options of a command."""


def make_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="tokshuf", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"tokshuf {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _cli_build.add_parser(sub)
    _cli_blend.add_parser(sub)
    _cli_read.add_parser(sub)
    _cli_status.add_parser(sub)
    _cli_verify.add_parser(sub)
    _cli_check.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    debug = os.environ.get("TOKSHUF_DEBUG", "") not in ("", "0")
    try:
        with warnings.catch_warnings():
            if not debug:
                # A warning is one line, as an error is, not Python's file:line and source.
                warnings.showwarning = lambda message, *_, **__: print(f"tokshuf: warning: {message}", file=sys.stderr)
            return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader of our output (say `| head`) has had enough: not an error. Later writes
        # (and the interpreter's final flush) go nowhere.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    # A progress bar has ended its line by now (build/progress.rs): the message has its own.
    except (TokshufError, OSError) as e:
        # OSError: the command's own files and streams (an --output-json folder that is not
        # there, a full disk under stdout), named by the message.
        if debug:
            raise
        print(f"tokshuf: error: {e}", file=sys.stderr)
        try:
            sys.stdout.flush()
        except OSError:  # stdout is what failed: its last flush, at exit, would fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        # check-tokenizer, like cmp, keeps 1 for "they differ".
        return int(getattr(args, "error_code", 1))
    except KeyboardInterrupt:
        if debug:
            raise
        again = "; run the same command again to resume" if args.command == "build" else ""
        print(f"tokshuf: interrupted{again}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
