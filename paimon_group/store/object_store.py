"""Object-store warehouses: bounded requests, and one line when the store fails.

pypaimon builds the pyarrow ``S3FileSystem`` of an ``s3://`` (or ``oss://``) warehouse with
10 attempts and 60 s connect and request timeouts, and no catalog option
changes them. A wrong ``s3.endpoint`` or an unreachable store then hangs a
member for a minute or more on its first request (the retries back off up to
20 s each), and again on every later one. So right after the catalog is
created, before its first request, :func:`bound_requests` builds the file
system of the catalog's FileIO again, through pypaimon's own code (the same
endpoint, keys, region and addressing), with our bounds: :data:`ATTEMPTS`
attempts, each waiting at most ``timeout / ATTEMPTS`` seconds to connect or
for the server to send anything. One request then gives up in about
``timeout`` seconds. The table shares the catalog's FileIO, so every file
access of a member (snapshots, manifests, data files, consumer files) is
bounded, not only the first.

The timeout is the catalog option :data:`TIMEOUT_OPTION` (seconds, default
:data:`DEFAULT_TIMEOUT_S`). The read timeout bounds a *stall* (no byte
received), not a whole transfer: a large file read slowly but steadily is
not cut.

:func:`store_failure` turns the error of a failed request into one line
naming the endpoint (never a key: the known secret values are scrubbed and
the endpoint is shown without user information).

Example::

    catalog = CatalogFactory.create(options)
    bound_requests(catalog.file_io, warehouse, options)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from coordinators.credentials import scrub, secret_values
from coordinators.errors import ConfigError
from coordinators.urls import redact_url, userinfo_end
from paimon_group.errors import ObjectStoreUnavailable

__all__ = ["ATTEMPTS", "DEFAULT_TIMEOUT_S", "TIMEOUT_OPTION", "bound_requests",
           "endpoint_of", "refuse_credentials_in_endpoint", "request_timeout_s",
           "store_failure"]

TIMEOUT_OPTION: Final = "paimon-group.s3.timeout-s"
DEFAULT_TIMEOUT_S: Final = 10.0
ATTEMPTS: Final = 3

# "... during HeadObject operation: curlCode: 7, Couldn't connect to server"
_CURL_CODE = re.compile(r"^.*curlCode: \d+, ")
# Stores reached through pyarrow's S3 client: S3, and OSS (pypaimon's
# fs.oss.impl=legacy, the default without pyjindosdk).
_S3_SCHEMES = frozenset({"s3", "s3a", "s3n", "oss"})
_ENDPOINT_KEYS = ("s3.endpoint", "s3a.endpoint", "fs.s3.endpoint", "fs.s3a.endpoint",
                  "fs.oss.endpoint")


def request_timeout_s(options: Mapping[str, str]) -> float:
    """The :data:`TIMEOUT_OPTION` of ``options`` (a ConfigError unless a positive number)."""
    given = options.get(TIMEOUT_OPTION)
    if given is None or str(given).strip() == "":
        return DEFAULT_TIMEOUT_S
    try:
        value = float(given)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"catalog option {TIMEOUT_OPTION}={given!r}: expected a positive "
                          f"number of seconds (default {DEFAULT_TIMEOUT_S:g})")
    return value


def _pyarrow_file_io(file_io: Any) -> Any | None:
    """pypaimon's ``PyArrowFileIO`` on an S3 file system under ``file_io``
    (maybe wrapped by its caching FileIO), else None."""
    import pyarrow.fs as pafs

    inner = getattr(file_io, "_delegate", file_io)
    if not isinstance(getattr(inner, "filesystem", None), pafs.S3FileSystem):
        return None  # OSS through pyjindosdk (not pyarrow) included: its own bounds
    builder = "_initialize_oss_fs" if getattr(inner, "_is_oss", False) else "_initialize_s3_fs"
    if not callable(getattr(inner, builder, None)):
        return None
    return inner


def bound_requests(file_io: Any, warehouse: str, options: Mapping[str, str]) -> None:
    """Rebuild the S3 file system of ``file_io`` with bounded attempts and timeouts.

    Nothing is done for a warehouse that is not ``s3://``, ``s3a://``, ``s3n://``
    or ``oss://`` (OSS through pyarrow's S3 client).
    """
    timeout = request_timeout_s(options)
    refuse_credentials_in_endpoint(options)
    if urlsplit(warehouse).scheme.lower() not in _S3_SCHEMES:
        return
    inner = _pyarrow_file_io(file_io)
    if inner is None:
        return
    default_config = inner._create_s3_retry_config
    per_attempt = timeout / ATTEMPTS

    def bounded(**_ignored: Any) -> dict[str, Any]:
        config: dict[str, Any] = default_config(
            max_attempts=ATTEMPTS, request_timeout=per_attempt, connect_timeout=per_attempt)
        return config

    # pypaimon takes its bounds from this method's defaults: shadow it on the
    # instance for one rebuild only (the FileIO stays picklable).
    inner._create_s3_retry_config = bounded
    try:
        if getattr(inner, "_is_oss", False):  # pyarrow's S3 client on OSS's endpoint
            inner.filesystem = inner._initialize_oss_fs(warehouse)
        else:
            inner.filesystem = inner._initialize_s3_fs()
    finally:
        del inner._create_s3_retry_config


def refuse_credentials_in_endpoint(options: Mapping[str, str]) -> None:
    """Refuse ``s3.endpoint=http://KEY:SECRET@host`` in one line that never echoes it
    (an endpoint is not a secret-looking option: reprs and errors would show it).
    The secret may hold ``/``, ``?``, ``#`` or ``@`` (:func:`coordinators.urls.userinfo_end`)."""
    for key in _ENDPOINT_KEYS:
        scheme, sep, rest = str(options.get(key) or "").partition("://")
        if userinfo_end(rest if sep else scheme) >= 0:
            shown = f"{scheme}://***@..." if sep else "***@..."
            raise ConfigError(
                f"catalog option {key}={shown} carries credentials: give them as "
                "s3.access-key and s3.secret-key (and s3.session-token) in a --config file "
                "or PAIMON_GROUP_CATALOG_OPTION")


def endpoint_of(options: Mapping[str, str]) -> str:
    """The configured S3 endpoint, without any user information, or a description
    of AWS's own endpoint when none is given."""
    for key in _ENDPOINT_KEYS:
        endpoint = options.get(key)
        if endpoint:
            scheme, sep, rest = endpoint.partition("://")
            text = rest if sep else scheme
            shown = text[userinfo_end(text) + 1:]  # never user information
            return f"{scheme}://{shown}" if sep else shown
    region = options.get("s3.region") or options.get("fs.s3a.region")
    return f"the AWS S3 endpoint of region {region}" if region else "the AWS S3 endpoint"


def _os_error(err: BaseException) -> OSError | None:
    """The OSError ``err`` is or was raised from (pypaimon wraps some in RuntimeError)."""
    seen: BaseException | None = err
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def store_failure(err: BaseException, table: str, warehouse: str,
                  options: Mapping[str, str]) -> ObjectStoreUnavailable | None:
    """One line for a failed request to the object store of ``warehouse``, or None
    when ``err`` is no such failure (not an OSError, not an object-store warehouse)."""
    if urlsplit(warehouse).scheme.lower() not in _S3_SCHEMES:
        return None
    cause = _os_error(err)
    if cause is None:
        return None
    endpoint = endpoint_of(options)
    reason = scrub(" ".join(str(cause).split()), secret_values(options))
    warehouse = redact_url(warehouse)
    if "NETWORK_CONNECTION" in reason:
        return ObjectStoreUnavailable(
            f"cannot reach object store {endpoint} (warehouse {warehouse}, table {table}) "
            f"within {request_timeout_s(options):g} s: {_CURL_CODE.sub('', reason)} "
            f"(check s3.endpoint; catalog option {TIMEOUT_OPTION} sets the timeout)")
    return ObjectStoreUnavailable(
        f"object store {endpoint} failed a request (warehouse {warehouse}, table {table}): "
        f"{reason} (check s3.endpoint, the keys s3.access-key and s3.secret-key, "
        "and the bucket)")
