"""Logging setup: readable text, or one JSON object per line.

JSON lines carry ``group``, ``member``, ``shard``, ``epoch`` and ``generation``
when the log call supplies them (``extra={...}``). Credentials are never
logged: coordinator URLs are logged through :func:`coordinators.redact_url`
and secrets are :class:`coordinators.Secret`.

Example::

    configure_logging("json", "INFO")
    logging.getLogger("paimon_group").info("hello", extra={"group": "g"})
"""

from __future__ import annotations

import json
import logging
import sys
import time

CONTEXT_FIELDS = ("group", "member", "shard", "epoch", "generation")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(out, sort_keys=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s%(context)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{n}={getattr(record, n)}" for n in CONTEXT_FIELDS
                 if getattr(record, n, None) is not None]
        record.context = (" [" + " ".join(parts) + "]") if parts else ""
        return super().format(record)


def configure_logging(fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Chatty libraries stay at WARNING unless asked for DEBUG. The coordinator
    # clients log every connection retry (kazoo at WARNING, one line per
    # attempt): below DEBUG they are silent, and what failed is said once, by
    # our own error line.
    if level.upper() != "DEBUG":
        for name in ("pypaimon", "py4j", "urllib3"):
            logging.getLogger(name).setLevel(logging.WARNING)
        for name in ("kazoo", "coordinators.zookeeper.kazoo", "aetcd", "grpc"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
