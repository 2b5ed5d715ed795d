"""Run a command on a pseudo-terminal and replay what it wrote the way a terminal shows it.

The screen model covers what progress bars use: printable text with the pending wrap of a
full last column (xterm's "xenl"), carriage return, newline, erase-line (ESC[K, ESC[2K), cursor
up/down (ESC[nA, ESC[nB) and mode switches (ignored). Anything else is an error, so a bar that
starts sending other sequences is noticed instead of misread.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

CSI = re.compile(rb"\x1b\[(\??)([0-9;]*)([A-Za-z])")


def screen(data: bytes, width: int) -> List[str]:
    """The lines a terminal `width` columns wide shows after receiving `data`."""
    rows: List[List[str]] = [[]]
    row = col = 0
    pending_wrap = False
    text = data.decode("utf-8", errors="replace").encode("utf-8")
    i = 0

    def put(ch: str) -> None:
        nonlocal row, col, pending_wrap
        if pending_wrap:
            row, col, pending_wrap = row + 1, 0, False
        while len(rows) <= row:
            rows.append([])
        line = rows[row]
        line.extend(" " * (col + 1 - len(line)))
        line[col] = ch
        if col == width - 1:
            pending_wrap = True
        else:
            col += 1

    while i < len(text):
        m = CSI.match(text, i)
        if m:
            private, arg, cmd = m.group(1), m.group(2).decode(), m.group(3).decode()
            n = int(arg) if arg.isdigit() else 1
            pending_wrap = False
            if private:
                pass  # cursor visibility and the like
            elif cmd == "K":
                while len(rows) <= row:
                    rows.append([])
                if arg in ("", "0"):
                    del rows[row][col:]
                else:  # 1: to the cursor (not used), 2: whole line
                    rows[row] = [] if arg == "2" else [" "] * col + rows[row][col:]
            elif cmd == "A":
                row = max(0, row - n)
            elif cmd == "B":
                row += n
            elif cmd == "J" and arg in ("", "0"):
                del rows[row + 1 :]
                del rows[row][col:]
            else:
                raise AssertionError(f"unexpected escape sequence {m.group(0)!r}")
            i = m.end()
            continue
        ch = chr(text[i]) if text[i] < 0x80 else None
        if ch is None:  # a multi-byte character: decode it whole
            j = i + 1
            while j < len(text) and 0x80 <= text[j] < 0xC0:
                j += 1
            put(text[i:j].decode("utf-8"))
            i = j
            continue
        if ch == "\r":
            col, pending_wrap = 0, False
        elif ch == "\n":
            row, pending_wrap = row + 1, False
        elif ch == "\x1b":
            raise AssertionError(f"unexpected escape sequence {text[i : i + 8]!r}")
        elif ch >= " ":
            put(ch)
        i += 1
    while len(rows) <= row:
        rows.append([])
    return ["".join(r).rstrip() for r in rows]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: bytes  # the raw bytes the terminal received

    def screen(self, width: int) -> List[str]:
        lines = screen(self.stderr, width)
        while lines and not lines[-1]:
            lines.pop()
        return lines


def run_on_tty(
    argv: Sequence[str],
    *,
    width: int = 100,
    env: Optional[Dict[str, str]] = None,
    interrupt_when: Optional[Callable[[bytes], bool]] = None,
    timeout: float = 300,
) -> Result:
    """Run `argv` with stderr (and stdin) on a pseudo-terminal `width` columns wide and stdout
    on a pipe. `interrupt_when(output so far)` true: send SIGINT once, as Ctrl-C would."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, width, 0, 0))
    full_env = {k: v for k, v in os.environ.items() if k != "TOKSHUF_DEBUG"}
    full_env.update(TERM="xterm", COLUMNS=str(width), **(env or {}))
    # SIGINT as a terminal's Ctrl-C meets it: a shell starts background jobs with SIGINT
    # ignored, and Python keeps an ignored SIGINT ignored, so a test suite run with `&`
    # would pass that on to the command.
    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=full_env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    os.close(slave)
    received = b""
    interrupted = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed its end
                    break
                if not data:
                    break
                received += data
            if interrupt_when is not None and not interrupted and interrupt_when(received):
                proc.send_signal(signal.SIGINT)
                interrupted = True
        out = proc.stdout.read().decode() if proc.stdout else ""
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        os.close(master)
    return Result(code, out, received)
