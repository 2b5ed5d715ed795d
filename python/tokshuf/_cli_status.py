"""``python -m tokshuf status OUTPUT``: how far a build (finished or not) has come."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Dict, Optional

from . import _core
from ._inputs import PathLike


def build_status(output: PathLike, local_cell_dir: Optional[PathLike] = None) -> Dict[str, Any]:
    """Progress of the build in ``output`` (a folder or an object-store URL): ``status`` (as in
    tokshuf.json: building, streaming, writing, complete), ``stage``, ``files_done`` /
    ``files_total`` (stage 1), ``chunks_written`` (shards there), ``chunks_listed`` (lines in
    manifest.jsonl), ``chunks_planned`` (None until the chunk plan is known) and ``running``
    (None when it cannot be known: a store without a build lease), ``work_dir`` (the unfinished
    build's work folder, None where ``work_looked`` holds none). Pass the build's
    ``local_cell_dir`` if it had one, to find its work folder."""
    return json.loads(
        _core.build_status(os.fspath(output), None if local_cell_dir is None else os.fspath(local_cell_dir))
    )


def format_status(s: Dict[str, Any]) -> str:
    planned = s["chunks_planned"]
    chunks = f"{s['chunks_written']:,} written, {s['chunks_listed']:,} in manifest"
    chunks += f" / {planned:,} planned" if planned is not None else " / plan not known yet"
    lines = [
        f"tokshuf: {s['output']}",
        f"  status      {s['status']} (stage: {s['stage']})",
        f"  files       {s['files_done']:,} / {s['files_total']:,} tokenized",
        f"  chunks      {chunks}",
    ]
    if s["status"] != "complete" and s.get("work_dir") is None:
        lines.append(f"  work        none at {s['work_looked']} (if the build had --local-cell-dir, pass it too)")
    if s["status"] != "complete":
        running = s.get("running")
        lines.append(
            "  build       running"
            if running
            else "  build       not running: run the same build command again to resume it"
            if running is False
            else "  build       not known (a build into a store keeps a lease only with engine='ray')"
        )
    return "\n".join(lines)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="show how far a build has come (finished or not)",
        description="Show the progress of a build in OUTPUT: stage, files tokenized, chunks written.",
    )
    p.add_argument("output", help="the build's output folder or URL")
    p.add_argument("--local-cell-dir", default=None, help="the build's --local-cell-dir, if it had one")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=_cmd_status)


def _cmd_status(args: argparse.Namespace) -> int:
    s = build_status(args.output, args.local_cell_dir)
    print(json.dumps(s, indent=2) if args.json else format_status(s))
    return 0
