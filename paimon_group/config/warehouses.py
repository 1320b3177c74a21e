"""Which warehouse a URI names, and where its host-local coordinator lives.

A local warehouse (a path, or ``file://``) has an implicit embedded
coordinator beside its databases. A remote one (``s3://``, ``oss://`` ...)
has none: an implicit file on each host would split one group into one group
per host (every row delivered once per host). A host-local coordinator for a
remote warehouse is an explicit choice, ``--coordinator local``, and its file
is keyed by the warehouse URI, so two warehouses never share group keys.

Example::

    >>> normalised_warehouse("S3A://Bucket/wh/")
    's3://bucket/wh'
    >>> local_state_dir_name("s3://bucket/wh")[:10]
    's3-bucket-'
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

__all__ = [
    "LOCAL_COORDINATOR",
    "is_remote",
    "local_state_dir_name",
    "local_state_file",
    "normalised_warehouse",
]

LOCAL_COORDINATOR = "local"
"""The ``--coordinator`` value that asks for the host-local embedded file."""

# Hadoop's names of the same S3 file system: one bucket, one warehouse.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


def is_remote(warehouse: str) -> bool:
    """True for a URI with a scheme other than ``file``."""
    scheme, sep, _ = warehouse.partition("://")
    return bool(sep) and scheme.lower() != "file"


def normalised_warehouse(warehouse: str) -> str:
    """The warehouse's canonical name: an absolute path for a local one;
    ``scheme://bucket/path`` (scheme and bucket lower case, ``s3a``/``s3n``
    as ``s3``, no empty or trailing path segments) for a remote one."""
    if not is_remote(warehouse):
        local = warehouse[len("file://"):] if warehouse.lower().startswith("file://") \
            else warehouse
        return str(Path(local).expanduser().resolve())
    scheme, _, rest = warehouse.partition("://")
    scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    bucket, _, path = rest.partition("/")
    segments = [s for s in path.split("/") if s]
    return f"{scheme}://{bucket.lower()}" + "".join(f"/{s}" for s in segments)


def local_state_dir_name(warehouse: str) -> str:
    """``<scheme>-<bucket>-<sha256 of the normalised URI, 12 hex>``."""
    uri = normalised_warehouse(warehouse)
    scheme, _, rest = uri.partition("://")
    bucket = re.sub(r"[^a-z0-9._-]", "-", rest.split("/", 1)[0])[:63] or "bucket"
    digest = hashlib.sha256(uri.encode()).hexdigest()[:12]
    return f"{scheme}-{bucket}-{digest}"


def local_state_file(warehouse: str) -> Path:
    """The host-local coordinator file of a remote warehouse:
    ``$XDG_STATE_HOME/paimon-group/warehouses/<dir>/coordinator.sqlite``
    (``XDG_STATE_HOME`` default ``~/.local/state``)."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return (Path(state).expanduser().resolve() / "paimon-group" / "warehouses"
            / local_state_dir_name(warehouse) / "coordinator.sqlite")
