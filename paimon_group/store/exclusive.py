"""A file created only if its name is free, atomically, across processes and hosts.

A Paimon commit is the creation of the file of snapshot ``N + 1``; of two
writers that both made a snapshot ``N + 1``, exactly one may create it, and
the other must learn that it lost (it then commits again on the newer
snapshot). pypaimon creates it with ``FileIO.try_to_write_atomic``: it asks
whether the file exists, then renames a temporary file to it. On a local
file system its check and rename are guarded by a lock of its own process
only, and ``rename(2)`` replaces what is there: two processes that both find
the name free both succeed, the second's snapshot replaces the first's, and
the first writer's commit is gone though it was told that it succeeded
(measured: 5 of 2,000 synchronised attempts of two processes; with two sink
processes committing 150 batches each into one target, one batch missing and
no error). On an object store a rename is a copy, which replaces as well;
Paimon's engine says so too (rename is atomic on a local file system and
HDFS; object stores need a lock).

:func:`create_exclusive` does it without a lock:

* **local file system**: the text goes to a temporary file beside the name,
  which is then ``link(2)``-ed to the name: a link fails with ``EEXIST``
  when the name exists, in one step (POSIX; also over NFS v3 and later); the
  temporary file is removed either way;
* **S3** (and S3-compatible stores: MinIO, moto): a conditional upload,
  ``If-None-Match: *``: the store answers 412 when the key exists (S3 since
  August 2024). pyarrow's S3 file system cannot send it, so the upload goes
  through boto3 (the ``s3`` extra), configured from that file system's own
  settings (endpoint, keys, region, addressing, timeouts): the same store as
  the table's other requests;
* **HDFS** (``hdfs://``, ``viewfs://``): pypaimon's own create, whose
  rename the NameNode refuses when the name exists (not run here: the suite
  has no HDFS);
* **anything else**: :class:`ExclusiveCreateUnsupported`, at once
  (:func:`exclusive_create_check`, called when a writer opens its table).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from paimon_group.errors import ConfigError
from paimon_group.store.files import write_beside

__all__ = ["ExclusiveCreateUnsupported", "create_exclusive", "exclusive_create_check"]

S3_SCHEMES = ("s3", "s3a", "s3n")
HDFS_SCHEMES = ("hdfs", "viewfs")


class ExclusiveCreateUnsupported(ConfigError):
    """The table's store cannot create a file only if its name is free."""


def _local_path(path: str) -> str | None:
    parsed = urlparse(path)
    if parsed.scheme == "file":
        return parsed.path
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return path
    return None


def _s3_file_system(file_io: Any) -> pafs.S3FileSystem | None:
    """pyarrow's S3 file system under pypaimon's ``file_io`` (maybe wrapped
    by its caching FileIO), or None."""
    inner = getattr(file_io, "_delegate", file_io)
    fs = getattr(inner, "filesystem", None)
    if isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs if isinstance(fs, pafs.S3FileSystem) else None


def exclusive_create_check(file_io: Any, path: str) -> None:
    """Raise :class:`ExclusiveCreateUnsupported` (one line) unless
    :func:`create_exclusive` can create files under ``path``."""
    scheme = urlparse(path).scheme
    if _local_path(path) is not None or scheme in HDFS_SCHEMES:
        return
    if scheme in S3_SCHEMES and _s3_file_system(file_io) is not None:
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise ExclusiveCreateUnsupported(
                "a Paimon sink on S3 commits with a conditional upload (If-None-Match), "
                "which needs boto3: pip install 'paimon-group[s3]'") from None
        return
    raise ExclusiveCreateUnsupported(
        f"a Paimon sink cannot commit safely on a {scheme}:// warehouse: its commits need a "
        "file created only if absent (a local file system, HDFS, or S3 and S3-compatible "
        "stores)")


def create_exclusive(file_io: Any, path: str, text: str) -> bool:
    """Create the file ``path`` holding ``text`` if no file has that name:
    True; False (nothing written) if one has, whoever made it and whenever."""
    local = _local_path(path)
    if local is not None:
        return _create_local(local, text)
    fs = _s3_file_system(file_io)
    if fs is not None and urlparse(path).scheme in S3_SCHEMES:
        return _create_s3(fs, path, text)
    if urlparse(path).scheme in HDFS_SCHEMES:
        return bool(file_io.try_to_write_atomic(path, text))
    exclusive_create_check(file_io, path)
    raise AssertionError("unreachable")  # pragma: no cover


def _create_local(path: str, text: str) -> bool:
    # A leading dot keeps the temporary file out of Paimon's listings by
    # prefix (snapshot-*).
    temporary = write_beside(path, text)
    try:
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def _s3_client(fs: pafs.S3FileSystem) -> Any:
    """A boto3 client for the store ``fs`` talks to, with its settings
    (read from the file system's own pickling arguments)."""
    import boto3
    from botocore.config import Config

    settings: dict[str, Any] = fs.__reduce__()[1][0]
    endpoint = settings.get("endpoint_override") or None
    if endpoint and "://" not in endpoint:
        endpoint = f"{settings.get('scheme') or 'https'}://{endpoint}"
    # pyarrow addresses buckets virtually unless an endpoint is set and
    # virtual addressing is not forced.
    virtual = bool(settings.get("force_virtual_addressing")) or not endpoint
    timeouts = {name: float(settings[key]) for name, key in
                (("connect_timeout", "connect_timeout"), ("read_timeout", "request_timeout"))
                if float(settings.get(key) or -1) > 0}
    config = Config(s3={"addressing_style": "virtual" if virtual else "path"},
                    retries={"max_attempts": 3, "mode": "standard"}, **timeouts)
    if settings.get("anonymous"):
        from botocore import UNSIGNED
        config = config.merge(Config(signature_version=UNSIGNED))
    session = boto3.session.Session(
        aws_access_key_id=settings.get("access_key") or None,
        aws_secret_access_key=settings.get("secret_key") or None,
        aws_session_token=settings.get("session_token") or None,
        region_name=settings.get("region") or None)
    return session.client("s3", endpoint_url=endpoint, config=config)


# One client per file system (a table's, kept as long as the process).
_clients: dict[int, tuple[pafs.S3FileSystem, Any]] = {}


def _create_s3(fs: pafs.S3FileSystem, path: str, text: str) -> bool:
    from botocore.exceptions import ClientError

    known = _clients.get(id(fs))
    if known is None or known[0] is not fs:
        known = _clients[id(fs)] = (fs, _s3_client(fs))
    client = known[1]
    parsed = urlparse(path)
    try:
        client.put_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"),
                          Body=text.encode("utf-8"), IfNoneMatch="*")
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        # 412: the key exists. 409: another conditional upload of the key is
        # under way (one of them wins; ours is treated as lost, and the
        # committer judges again on the newer snapshot).
        if status in (409, 412) or code in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True
