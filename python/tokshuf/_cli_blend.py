"""Command line pieces for blends.

- ``add_blend_arguments(parser)`` / ``blend_from_args(args, seed=...)``: what the ``read``
  subcommand uses for ``--blend PATH:WEIGHT`` (repeatable) and ``--blend-quantum D``.
- ``add_parser(sub)``: the ``blend`` subcommand, which prints the requested vs achieved ratios
  of a blend without reading any data::

      python -m tokshuf blend web:0.7 code:0.2 books:0.1 --num-examples 1000000
"""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING, List, Optional, Tuple

from ._cli_types import count
from .exceptions import ConfigError

if TYPE_CHECKING:
    from ._blend import Blend

# Equal to _blend.DEFAULT_QUANTUM (a test checks); _blend is imported only when a blend is used,
# so that the other commands never load NumPy.
DEFAULT_QUANTUM = 1 << 16


def parse_blend_spec(text: str) -> Tuple[str, float]:
    """``"PATH:WEIGHT"`` -> ``(PATH, WEIGHT)``, for argparse's ``type=``.

    The split is at the last colon, so paths may contain colons. The weight is any positive
    finite number (weights are normalised, ``a:7 b:3`` is ``a:0.7 b:0.3``).
    """
    path, sep, weight = text.rpartition(":")
    if not sep or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected PATH:WEIGHT, e.g. web_cache:0.7")
    try:
        w = float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: weight {weight!r} is not a number") from None
    if not (math.isfinite(w) and w > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: weight must be finite and > 0")
    return path, w


def add_blend_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--blend PATH:WEIGHT`` (repeatable) and ``--blend-quantum`` to a parser."""
    parser.add_argument(
        "--blend",
        action="append",
        type=parse_blend_spec,
        default=None,
        metavar="PATH:WEIGHT",
        help="read a weighted blend of caches instead of one cache; repeat once per cache (weights are normalised)",
    )
    parser.add_argument(
        "--blend-quantum",
        type=int,
        default=None,
        metavar="D",
        help=f"period of the blend schedule; shares are multiples of 1/D (default {DEFAULT_QUANTUM})",
    )


def blend_from_args(args: argparse.Namespace, *, seed: int = 0) -> Optional[Blend]:
    """The :class:`Blend` the parsed ``--blend`` arguments describe, or None without any."""
    specs: Optional[List[Tuple[str, float]]] = getattr(args, "blend", None)
    quantum = getattr(args, "blend_quantum", None)
    if not specs:
        if quantum is not None:
            raise ConfigError("--blend-quantum applies to a blend: give --blend PATH:WEIGHT too")
        return None
    from ._blend import Blend

    return Blend(specs, seed=seed, quantum=DEFAULT_QUANTUM if quantum is None else quantum)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "blend",
        help="show how a weighted blend of caches is scheduled (requested vs achieved ratios)",
        description="Show the schedule of a weighted blend of caches: requested and achieved "
        "ratios, draws per period, and optionally how many passes over each cache a run takes.",
    )
    p.add_argument(
        "specs",
        nargs="+",
        type=parse_blend_spec,
        metavar="PATH:WEIGHT",
        help="a cache folder (or URL) and its weight; one per cache",
    )
    p.add_argument(
        "--quantum", type=int, default=DEFAULT_QUANTUM, help=f"period of the schedule (default {DEFAULT_QUANTUM})"
    )
    p.add_argument(
        "--num-examples",
        type=count,
        default=None,
        help="also count draws of each cache among the first N blended examples",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_blend)


def _cmd_blend(args: argparse.Namespace) -> int:
    from ._blend import Blend

    blend = Blend(args.specs, quantum=args.quantum)
    desc = blend.describe(args.num_examples)
    print(json.dumps(desc.to_dict(), indent=2) if args.json else desc)
    return 0
