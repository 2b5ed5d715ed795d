"""argparse types of the command line's numbers: a malformed one is argparse's error (exit 2)."""

from __future__ import annotations

import argparse

SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count: 8G, 512M, 1.5GiB, 4096."""
    t = text.strip().lower().rstrip("ib").rstrip("b") if text[-1:].lower() == "b" else text.strip().lower()
    try:
        n = int(float(t[:-1]) * SIZE_UNITS[t[-1]]) if t and t[-1] in SIZE_UNITS else int(t)
    except (ValueError, OverflowError):  # not a number; inf
        n = 0
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: give bytes, or a number with K, M, G or T (e.g. 8G)")
    return n


def count(text: str) -> int:
    """A whole number >= 0."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count: give a whole number >= 0")
    return n
