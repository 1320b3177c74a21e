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
  synced to disk, which is then ``link(2)``-ed to the name: a link fails
  with ``EEXIST`` when the name exists, in one step (POSIX; also over NFS v3
  and later); the temporary file is removed either way. The directory is
  synced after a link that created the name (and the parent of a directory
  it had to make), so once :func:`create_exclusive` returned True the file
  and its name survive a crash of the host: a position committed after a
  snapshot never points past a snapshot the crash lost;
* **S3** (and S3-compatible stores: MinIO, moto): a conditional upload,
  ``If-None-Match: *``: the store answers 412 when the key exists (S3 since
  August 2024). pyarrow's S3 file system cannot send it, so the upload goes
  through boto3 (the ``s3`` extra), configured from that file system's own
  settings (endpoint, keys, region, addressing, timeouts): the same store as
  the table's other requests. A completed upload is durable (S3 answers once
  the object is stored). A store may accept the header and ignore it (the
  upload then replaces the key, and both writers win): the first
  :func:`exclusive_create_check` of a process on an (endpoint, bucket)
  uploads a probe key twice, conditionally, deletes it, and refuses the
  store unless the second upload was refused;
* **anything else**, HDFS (``hdfs://``, ``viewfs://``) included:
  :class:`ExclusiveCreateUnsupported`, at once (:func:`exclusive_create_check`,
  called when a writer opens its table). pypaimon reaches HDFS through
  hdfs-native, or without it through pyarrow, whose move deletes an existing
  destination and renames again; both ask whether the name exists, then
  rename: not a create only if absent.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

from paimon_group.errors import ConfigError, ObjectStoreUnavailable
from paimon_group.store.files import sync_directory, write_beside

__all__ = ["ExclusiveCreateUnsupported", "create_exclusive", "exclusive_create_check"]

S3_SCHEMES = ("s3", "s3a", "s3n")
# The probe key's name, beside the snapshots (a leading dot: out of Paimon's
# listings by prefix).
PROBE_PREFIX = ".exclusive-create-probe-"


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
    if _local_path(path) is not None:
        return
    fs = _s3_file_system(file_io)
    if scheme in S3_SCHEMES and fs is not None:
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise ExclusiveCreateUnsupported(
                "a Paimon sink on S3 commits with a conditional upload (If-None-Match), "
                "which needs boto3: pip install 'paimon-group[s3]'") from None
        _probe_conditional_upload(fs, path)
        return
    raise ExclusiveCreateUnsupported(
        f"a Paimon sink cannot commit safely on a {scheme}:// warehouse: its commits need a "
        "file created only if absent (a local file system, or S3 and S3-compatible "
        "stores that honour If-None-Match)")


def create_exclusive(file_io: Any, path: str, text: str) -> bool:
    """Create the file ``path`` holding ``text`` if no file has that name:
    True; False (nothing written) if one has, whoever made it and whenever."""
    local = _local_path(path)
    if local is not None:
        return _create_local(local, text)
    fs = _s3_file_system(file_io)
    if fs is not None and urlparse(path).scheme in S3_SCHEMES:
        return _create_s3(fs, path, text)
    exclusive_create_check(file_io, path)
    raise AssertionError("unreachable")  # pragma: no cover


def _create_local(path: str, text: str) -> bool:
    # A leading dot keeps the temporary file out of Paimon's listings by
    # prefix (snapshot-*). Its text is on disk before the name links to it.
    temporary = write_beside(path, text, sync=True)
    try:
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        sync_directory(os.path.dirname(path) or ".")  # the name, on disk
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


def _client_of(fs: pafs.S3FileSystem) -> Any:
    known = _clients.get(id(fs))
    if known is None or known[0] is not fs:
        known = _clients[id(fs)] = (fs, _s3_client(fs))
    return known[1]


def _create_s3(fs: pafs.S3FileSystem, path: str, text: str) -> bool:
    parsed = urlparse(path)
    return _put_if_absent(_client_of(fs), parsed.netloc, parsed.path.lstrip("/"),
                          text.encode("utf-8"))


def _put_if_absent(client: Any, bucket: str, key: str, body: bytes) -> bool:
    """Upload ``key`` if absent: True; False if the store refused (the key
    exists, or another conditional upload of it is under way)."""
    from botocore.exceptions import ClientError

    try:
        client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
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


# The (endpoint, bucket) pairs whose store refused a second conditional
# upload of a key, in this process.
_honouring: set[tuple[str, str]] = set()
_probe_lock = threading.Lock()


def _probe_conditional_upload(fs: pafs.S3FileSystem, path: str) -> None:
    """Raise :class:`ExclusiveCreateUnsupported` (one line) unless the store
    under ``path`` refuses a conditional upload of an existing key: two
    uploads of a probe key beside the snapshots, then its delete; once per
    (endpoint, bucket) per process."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = _client_of(fs)
    parsed = urlparse(path)
    bucket = parsed.netloc
    endpoint = str(client.meta.endpoint_url)
    with _probe_lock:
        if (endpoint, bucket) in _honouring:
            return
        key = f"{parsed.path.strip('/')}/snapshot/{PROBE_PREFIX}{uuid.uuid4().hex}".lstrip("/")
        try:
            try:
                created = _put_if_absent(client, bucket, key, b"probe")
                replaced = created and _put_if_absent(client, bucket, key, b"probe again")
            finally:
                with contextlib.suppress(ClientError, BotoCoreError):
                    client.delete_object(Bucket=bucket, Key=key)
        except ClientError as err:
            error = err.response.get("Error", {})
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 501 or error.get("Code") == "NotImplemented":
                raise ExclusiveCreateUnsupported(
                    f"the object store {endpoint} (bucket {bucket}) does not support "
                    "conditional uploads (If-None-Match), which the commits of a Paimon "
                    "sink need; use a store that does (AWS S3, MinIO)") from None
            raise ObjectStoreUnavailable(
                f"object store {endpoint} failed the Paimon sink's probe of conditional "
                f"uploads in bucket {bucket}: {error.get('Code') or status} "
                f"{' '.join(str(error.get('Message') or '').split())}".rstrip()) from None
        except BotoCoreError as err:
            raise ObjectStoreUnavailable(
                f"object store {endpoint} failed the Paimon sink's probe of conditional "
                f"uploads in bucket {bucket}: {' '.join(str(err).split())}") from None
        if not created:
            raise ExclusiveCreateUnsupported(
                f"the object store {endpoint} (bucket {bucket}) refused a conditional upload "
                "(If-None-Match) of a new key, so a Paimon sink could never commit; use a "
                "store that honours it (AWS S3, MinIO)")
        if replaced:
            raise ExclusiveCreateUnsupported(
                f"the object store {endpoint} (bucket {bucket}) ignores If-None-Match: a "
                "second conditional upload of one key replaced it, so two commits of a "
                "Paimon sink could both take one snapshot id; use a store that refuses it "
                "(AWS S3, MinIO)")
        _honouring.add((endpoint, bucket))
