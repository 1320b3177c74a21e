"""A real S3-compatible server for the test suite (moto's server), on a free loopback port.

The server runs in a process of its own (``python -m tests.support.s3_server
--port N``), behind a small WSGI layer that counts every request it serves,
by method and by kind (``GET`` of a whole object, ranged ``GET``, ``HEAD``,
``PUT``, ``LIST``, multipart steps, ``DELETE``), so that tests and benchmarks
can say how many requests a read made. The layer answers two paths of its own:
``GET /__counts`` (the counts as JSON) and ``POST /__counts/reset``.

Fixtures (loaded as a pytest plugin from ``tests/conftest.py``):

``s3_server``
    One server for the whole session.
``s3_warehouse``
    ``S3Warehouse``: a bucket of the test's own on the shared server, with the
    warehouse URI (``s3://<bucket>/wh``) and the pypaimon catalog options that
    reach it (``s3.endpoint``, keys, region, path-style access).

Without moto the S3 tests are skipped, except in CI (``CI=true``) where they
fail with one line: a CI run must never pass by skipping its integration tests.

Example::

    def test_read(s3_warehouse):
        make_pk_table(s3_warehouse.uri, "db.t", options=s3_warehouse.options)
        s3_warehouse.server.reset_counts()
        ...
        assert s3_warehouse.server.counts()["total"] < 100
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ACCESS_KEY = "pg-test-access"
SECRET_KEY = "pg-test-SECRET-8f3a"
REGION = "us-east-1"
START_TIMEOUT_S = 30.0
TIMELINE = 10_000


def request_kind(environ: dict[str, Any]) -> str:
    """The kind of one S3 request, from its method, query and headers."""
    method = environ.get("REQUEST_METHOD", "GET")
    query = environ.get("QUERY_STRING", "")
    path = environ.get("PATH_INFO", "/")
    key = path.lstrip("/").split("/", 1)[1] if "/" in path.lstrip("/") else ""
    if "uploads" in query.split("&") or query.startswith("uploads"):
        return "MULTIPART_START"
    if "uploadId=" in query:
        return "MULTIPART_PART" if method == "PUT" else (
            "MULTIPART_COMPLETE" if method == "POST" else "MULTIPART_ABORT")
    if method == "GET" and (not key or "list-type" in query or "prefix=" in query):
        return "LIST"
    if method == "GET":
        return "GET_RANGE" if environ.get("HTTP_RANGE") else "GET"
    return method


class CountingApp:
    """WSGI middleware: counts requests by kind, and serves ``/__counts``."""

    def __init__(self, app: Callable[..., Any], latency_s: float = 0.0) -> None:
        self.app = app
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.conditional = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.paths: Counter[str] = Counter()
        # (wall time, "KIND /path") of the last TIMELINE requests: where a
        # process waits on the store (benchmarks' diagnostics).
        self.timeline: collections.deque[tuple[float, str]] = collections.deque(maxlen=TIMELINE)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "/")
        if path.startswith("/__counts"):
            with self.lock:
                if path.endswith("/reset"):
                    self.counts.clear()
                    self.paths.clear()
                    self.timeline.clear()
                body = json.dumps({"counts": dict(self.counts), "paths": dict(self.paths),
                                   "timeline": list(self.timeline)}).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        kind = request_kind(environ)
        with self.lock:
            self.counts[kind] += 1
            self.paths[f"{kind} {path}"] += 1
            self.timeline.append((time.time(), f"{kind} {path}"))
        if self.latency_s:
            time.sleep(self.latency_s)  # a store's time to first byte, per request
        if environ.get("HTTP_IF_NONE_MATCH") and environ.get("REQUEST_METHOD") == "PUT":
            # moto checks a conditional upload's key, then stores it, in
            # two steps of a threaded server; S3 does both at once: so
            # does this server, one conditional upload at a time.
            with self.conditional:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def serve(port: int) -> None:
    """Run moto's server with the counting layer until killed."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    # PG_S3_LATENCY_MS: a delay before every answer, for a store farther away
    # than loopback (benchmarks; tests leave it at 0).
    latency_s = float(os.environ.get("PG_S3_LATENCY_MS") or 0) / 1000.0
    app = CountingApp(DomainDispatcherApplication(create_backend_app), latency_s)
    server = make_server("127.0.0.1", port, app, threaded=True,
                         request_handler=MotoRequestHandler)
    print("ready", flush=True)
    server.serve_forever()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class S3Server:
    """One running server process; ``endpoint`` is ``http://127.0.0.1:PORT``."""

    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the server process (e.g. moto's ``INITIAL_NO_AUTH_ACTION_COUNT``)."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.s3_server", "--port", str(self.port)],
                cwd=REPO, stdout=subprocess.PIPE, stderr=log, env={**os.environ, **self.env})
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = self.proc.stdout.readline()
        if not line.startswith(b"ready"):
            raise RuntimeError(f"S3 server did not start: see {self.log}")
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.counts()
                return
            time.sleep(0.05)
        raise RuntimeError(f"S3 server on {self.endpoint} did not answer: see {self.log}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _counts_doc(self, reset: bool = False) -> dict[str, Any]:
        url = f"{self.endpoint}/__counts" + ("/reset" if reset else "")
        req = urllib.request.Request(url, method="POST" if reset else "GET")
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc

    def counts(self, *, contains: str | None = None) -> dict[str, int]:
        """Requests by kind since the last reset, plus ``total``; with
        ``contains``, only requests whose path contains that string."""
        doc = self._counts_doc()
        if contains is None:
            out = dict(doc["counts"])
        else:
            out = {}
            for name, n in doc["paths"].items():
                kind, _, path = name.partition(" ")
                if contains in path:
                    out[kind] = out.get(kind, 0) + n
        out["total"] = sum(out.values())
        return out

    def paths(self) -> dict[str, int]:
        """``"KIND /bucket/key": count`` since the last reset."""
        return dict(self._counts_doc()["paths"])

    def timeline(self) -> list[tuple[float, str]]:
        """``(wall time, "KIND /bucket/key")`` of the last requests since the last reset."""
        return [(float(t), str(r)) for t, r in self._counts_doc()["timeline"]]

    def reset_counts(self) -> None:
        self._counts_doc(reset=True)

    def create_bucket(self, name: str) -> None:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name=REGION)
        client.create_bucket(Bucket=name)


@dataclass
class S3Warehouse:
    """A bucket of one test's own, and how pypaimon reaches it."""

    server: S3Server
    bucket: str
    uri: str
    options: dict[str, str] = field(default_factory=dict)

    def option_args(self) -> list[str]:
        """``--catalog-option K=V`` arguments (for tests only: in production the keys
        go in a ``--config`` file or the environment, never in argv)."""
        args: list[str] = []
        for key, value in self.options.items():
            args += ["--catalog-option", f"{key}={value}"]
        return args

    def env(self) -> dict[str, str]:
        """``PAIMON_GROUP_CATALOG_OPTION`` for a child process: the options, space-separated."""
        return {"PAIMON_GROUP_CATALOG_OPTION": " ".join(f"{k}={v}"
                                                          for k, v in self.options.items())}


def catalog_options(endpoint: str) -> dict[str, str]:
    return {
        "s3.endpoint": endpoint,
        "s3.access-key": ACCESS_KEY,
        "s3.secret-key": SECRET_KEY,
        "s3.region": REGION,
        "s3.path-style-access": "true",
    }


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    try:
        import boto3  # noqa: F401
        import moto  # noqa: F401
    except ImportError:
        _missing("moto[server] and boto3 are not installed: pip install -e '.[test]'")
    server = S3Server(free_port(), tmp_path_factory.mktemp("s3") / "server.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_warehouse(s3_server: S3Server) -> S3Warehouse:
    bucket = f"pg-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    warehouse = S3Warehouse(s3_server, bucket, f"s3://{bucket}/wh",
                            catalog_options(s3_server.endpoint))
    from tests.support.tables import register_catalog_options

    register_catalog_options(warehouse.uri, warehouse.options)
    return warehouse


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(list(argv) if argv is not None else None)
    serve(args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
