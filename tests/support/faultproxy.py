"""A loopback HTTP proxy that breaks requests on a seeded schedule (tests of the storage layer).

It sits between tokshuf and the S3 server, on 127.0.0.1 only. Each request it sees draws, from
``random.Random(seed)`` in arrival order, whether to pass it through or to inject one fault:

- ``slowdown``: answer ``503 SlowDown`` (S3's throttling reply) without forwarding;
- ``drop``: forward, then send the response headers and half the body (rounded up) and close the
  connection (a connection dropped mid-body; with no body, the reply is simply lost);
- ``stall``: forward, send the headers and part of the body, then go silent for ``stall_s``
  seconds before closing (longer than the client's timeout);
- ``hang``: go silent without forwarding for ``stall_s`` seconds, then close;
- ``reset``: close the connection without forwarding (the request never arrives).

``every=True`` injects a fault into every matching request. ``match(method, target)`` limits
faults to some requests (others pass through untouched). Counters record what was done, so a
test can check that faults really happened.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

KINDS = ("slowdown", "drop", "stall", "hang", "reset")

SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


def _read_until(sock: socket.socket, buf: bytearray, marker: bytes) -> Optional[int]:
    while True:
        i = buf.find(marker)
        if i >= 0:
            return i
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk


def _read_exact(sock: socket.socket, buf: bytearray, n: int) -> bool:
    while len(buf) < n:
        chunk = sock.recv(65536)
        if not chunk:
            return False
        buf += chunk
    return True


def _headers(head: bytes) -> Tuple[str, Dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    out = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip().lower()] = v.strip()
    return lines[0], out


def _read_request(sock: socket.socket, buf: bytearray) -> Optional[Tuple[bytes, str, str]]:
    """One request from the client (consumed from ``buf``): (raw bytes, method, target)."""
    end = _read_until(sock, buf, b"\r\n\r\n")
    if end is None:
        return None
    head = bytes(buf[: end + 4])
    del buf[: end + 4]
    first, hdrs = _headers(head)
    method, target = first.split(" ")[:2]
    body = bytearray()
    if hdrs.get("transfer-encoding", "").lower() == "chunked":
        while True:
            i = _read_until(sock, buf, b"\r\n")
            if i is None:
                return None
            size = int(bytes(buf[:i]).split(b";")[0], 16)
            need = i + 2 + size + 2
            if not _read_exact(sock, buf, need):
                return None
            body += buf[:need]
            del buf[:need]
            if size == 0:
                break
    else:
        n = int(hdrs.get("content-length", "0"))
        if not _read_exact(sock, buf, n):
            return None
        body += buf[:n]
        del buf[:n]
    return head + bytes(body), method, target


class FaultProxy:
    """Threads, loopback only. Use as a context manager or call ``start``/``stop``."""

    def __init__(
        self,
        upstream: Tuple[str, int],
        seed: int = 0,
        rate: float = 0.0,
        kinds: Sequence[str] = KINDS,
        every: bool = False,
        match: Optional[Callable[[str, str], bool]] = None,
        stall_s: float = 2.5,
    ) -> None:
        self.upstream = upstream
        self.stall_s = stall_s
        self.configure(seed=seed, rate=rate, kinds=kinds, every=every, match=match)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._conns: List[socket.socket] = []

    def configure(
        self,
        seed: int = 0,
        rate: float = 0.0,
        kinds: Sequence[str] = KINDS,
        every: bool = False,
        match: Optional[Callable[[str, str], bool]] = None,
    ) -> None:
        """Start a new schedule (and zero the counters)."""
        assert all(k in KINDS for k in kinds)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self.rate = rate
        self.kinds = list(kinds)
        self.every = every
        self.match = match
        self.faults: collections.Counter = collections.Counter()
        self.requests = 0
        self.log: List[Tuple[str, str, str]] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _decide(self, method: str, target: str) -> str:
        with self._lock:
            self.requests += 1
            draw = self._rng.random()
            kind = self._rng.choice(self.kinds)
            matched = self.match is None or self.match(method, target)
            fault = "ok" if not matched or not (self.every or draw < self.rate) else kind
            self.faults[fault] += 1
            self.log.append((method, target, fault))
            return fault

    def start(self) -> FaultProxy:
        t = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        try:  # wakes the accepting thread
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()
        for t in self._threads:
            t.join(timeout=self.stall_s + 5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(client)
            t = threading.Thread(target=self._serve, args=(client,), name="fault-proxy-conn", daemon=True)
            t.start()
            self._threads.append(t)

    def _forward(self, raw: bytes) -> bytes:
        """Send one request upstream on a fresh connection and return the whole raw reply."""
        head_end = raw.index(b"\r\n\r\n")
        head = raw[:head_end].split(b"\r\n")
        head = [h for h in head if not h.lower().startswith(b"connection:")] + [b"Connection: close"]
        with socket.create_connection(self.upstream, timeout=30) as up:
            up.sendall(b"\r\n".join(head) + raw[head_end:])
            out = bytearray()
            while True:
                chunk = up.recv(65536)
                if not chunk:
                    return bytes(out)
                out += chunk

    def _serve(self, client: socket.socket) -> None:
        buf = bytearray()
        try:
            while not self._stop.is_set():
                req = _read_request(client, buf)
                if req is None:
                    return
                raw, method, target = req
                fault = self._decide(method, target)
                if fault == "reset":
                    return
                if fault == "hang":
                    self._stop.wait(self.stall_s)
                    return
                if fault == "slowdown":
                    client.sendall(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                        + f"Content-Length: {len(SLOWDOWN_BODY)}\r\n\r\n".encode()
                        + SLOWDOWN_BODY
                    )
                    continue
                reply = self._forward(raw)
                split = reply.find(b"\r\n\r\n") + 4
                body = len(reply) - split
                if fault == "drop":
                    client.sendall(reply[: split + (body + 1) // 2] if body else b"")
                    return
                if fault == "stall":
                    client.sendall(reply[: split + body // 3] if body else b"")
                    self._stop.wait(self.stall_s)
                    return
                client.sendall(reply)
                _, hdrs = _headers(reply[:split])
                framed = "content-length" in hdrs or "chunked" in hdrs.get("transfer-encoding", "").lower()
                if not framed and method != "HEAD":
                    return
        except OSError:
            return
        finally:
            try:
                client.close()
            except OSError:
                pass
