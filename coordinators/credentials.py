"""Keeping credentials out of sight, and off plaintext connections.

Three rules, applied wherever an option or a connection is shown or opened:

* **Secret-looking keys are masked.** An option whose key contains one of
  :data:`SECRET_HINTS` (``s3.secret-key``, ``fs.oss.accessKeySecret``,
  ``dlf.token``, ``jdbc.password`` ...) is shown as ``KEY=***``
  (:func:`mask_options`, :func:`describe_option`). The rule errs on the side
  of masking: a masked value that was not secret costs nothing.
* **Known secret values are scrubbed** from any text that came from outside
  (a library's exception message, which may quote an option or a URL):
  :func:`scrub`.
* **Passwords are not sent in the clear.** etcd's ``Authenticate`` call and
  ZooKeeper's ``digest`` scheme (and SASL ``PLAIN``) put the password on the
  wire as it is; without TLS anyone on the path reads it. Such a
  configuration is refused, in one line and before anything is connected,
  unless it is allowed explicitly: ``ConnectOptions(allow_plaintext_credentials=True)``,
  ``--allow-plaintext-credentials`` on the command line
  (:func:`refuse_plaintext_credentials`).

Example::

    >>> mask_options({"s3.endpoint": "http://minio:9000", "s3.secret-key": "abc"})
    {'s3.endpoint': 'http://minio:9000', 's3.secret-key': '***'}
    >>> describe_option("s3.secret-key:abc")
    "'s3.secret-key:***'"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from typing import Any, Final

from coordinators.errors import ConfigError

MASK: Final = "***"

SECRET_HINTS: Final = (
    "secret",
    "password",
    "passwd",
    "pwd",
    "token",
    "key",
    "credential",
    "auth",
    "signature",
    "session",
    "private",
    "cookie",
)
"""Substrings (lower case) of option keys whose values are never shown."""

ALLOW_FLAG: Final = "--allow-plaintext-credentials"
ALLOW_OPTION: Final = "allow_plaintext_credentials"

# What separates a key from its value in a malformed ``KEY=VALUE`` pair.
_SEPARATOR = re.compile(r"[=:\s]")


def is_secret_key(key: str) -> bool:
    """True if ``key`` looks like it names a credential."""
    lowered = key.lower()
    return any(hint in lowered for hint in SECRET_HINTS)


def mask_options(options: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``options`` with the values of secret-looking keys masked."""
    return {k: (MASK if is_secret_key(k) else v) for k, v in options.items()}


def secret_values(options: Mapping[str, str]) -> list[str]:
    """The non-empty values of ``options`` under secret-looking keys."""
    return [v for k, v in options.items() if v and is_secret_key(k)]


def masked_repr(obj: Any, masked: str,
                urls: Mapping[str, Callable[[str], str]] | None = None) -> str:
    """A dataclass's generated repr, with the option mapping in field ``masked``
    shown through :func:`mask_options` (``ConnectOptions.extra``,
    ``MemberConfig.catalog_options``), and each string field named in ``urls``
    shown through its function (a URL's redaction). Fields declared with
    ``repr=False`` are left out, as in the generated repr."""
    shown = []
    for f in fields(obj):
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if f.name == masked:
            value = mask_options(value)
        elif urls and f.name in urls and isinstance(value, str):
            value = urls[f.name](value)
        shown.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(shown)})"


def describe_option(pair: str) -> str:
    """A ``KEY=VALUE`` pair as given by a user (maybe malformed), safe to print.

    The text up to the first ``=``, ``:`` or blank is taken for the key; what
    follows is shown only when that key is not secret-looking. Without any
    separator the text may be a bare secret: only its length is shown.
    """
    match = _SEPARATOR.search(pair)
    if match is None:
        return f"<{len(pair)} characters, not shown>" if pair else "''"
    key, sep = pair[: match.start()], match.group()
    if not key or is_secret_key(key):
        return repr(f"{key}{sep}{MASK}")
    return repr(pair)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``***``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def refuse_plaintext_credentials(backend: str, what: str, use_tls: str) -> ConfigError:
    """The one-line refusal of a password over a plaintext connection.

    ``what`` names the credential's use (e.g. ``"a username and password"``),
    ``use_tls`` how to get TLS on this backend.
    """
    return ConfigError(
        f"{backend} with {what} over a plaintext connection would send the password "
        f"unencrypted: {use_tls}, or allow it explicitly on a trusted network with "
        f"{ALLOW_FLAG} ({ALLOW_OPTION}=True in ConnectOptions)"
    )
