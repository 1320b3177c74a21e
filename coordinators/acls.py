"""ACLs as text that is safe to print: a ZooKeeper ``acl`` setting shown with
every digest hash masked, and nothing else hidden.

A digest entry ``digest:USER:HASH:PERMS`` carries the base64 SHA-1 of
``USER:PASSWORD``, which a dictionary attack turns back into the password: its
hash is shown as ``***``. The words ``creator`` and ``open`` and the other
entries (``sasl:USER:PERMS``, ``x509:SUBJECT:PERMS``, ``ip:ADDRESS:PERMS``)
hold no secret and are shown as they are.

Example::

    >>> show_acl_spec("creator,digest:alice:c2FsdA==:rw,sasl:auditor:r")
    'creator,digest:alice:***:rw,sasl:auditor:r'
    >>> show_acl_spec("open")
    'open'
"""

from __future__ import annotations

from typing import Final

MASK: Final = "***"


def show_acl_entry(entry: str) -> str:
    """One entry of an ``acl`` setting, its digest hash masked."""
    scheme, sep, rest = entry.partition(":")
    if not sep or scheme.strip().lower() != "digest":
        return entry
    user, _, tail = rest.partition(":")
    perms = tail.rpartition(":")[2] if ":" in tail else ""
    return f"{scheme}:{user}:{MASK}" + (f":{perms}" if perms else "")


def show_acl_spec(spec: str) -> str:
    """A comma-separated ``acl`` setting, each digest hash masked."""
    return ",".join(show_acl_entry(entry) for entry in spec.split(","))
