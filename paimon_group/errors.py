"""Errors of the group layer, in the one hierarchy of :mod:`coordinators.errors`.

Every class here derives from :class:`~coordinators.errors.PaimonGroupError`
(bad user input from :class:`~coordinators.errors.ConfigError`), so callers
catch one root and read its ``retriable`` flag. Messages are one line that
says what is wrong and what to do.
"""

from __future__ import annotations

from coordinators.errors import ConfigError, PaimonGroupError


class TableNotFound(ConfigError):
    """The Paimon table does not exist in the given warehouse."""


class UnsupportedTable(ConfigError):
    """The table's bucket mode cannot be sharded by ``bucket % shards``."""


class SnapshotExpired(PaimonGroupError):
    """A shard's next snapshot was expired before the shard read it.

    Never retriable and never skipped silently: the rows of the expired
    snapshots are gone for this shard. An operator must reset the shard's
    position explicitly (Paimon consumer files, which the group mirrors,
    exist to prevent this: check that they are written and not expired).
    """

    retriable = False
