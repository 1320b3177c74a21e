"""The embedded coordinator: one SQLite file shared by the processes of one host
(``sqlite:///ABSOLUTE/PATH.db``), or an in-memory database of one process
(``memory://NAME``).

Modules: ``coordinator`` (:class:`SqliteCoordinator`: the data model,
sessions and change notification), which assembles the others: ``url``,
``errors`` (the one translation of SQLite errors), ``database`` (opening a
file or an in-memory database, the schema), ``store`` (the transactions of
every operation), ``session`` and ``watch``. Nothing in the package imports
this ``__init__``: it only re-exports the backend's names.
"""

from coordinators.sqlite.coordinator import SqliteCoordinator
from coordinators.sqlite.database import read_boot_id
from coordinators.sqlite.errors import translate
from coordinators.sqlite.session import SqliteSession
from coordinators.sqlite.store import dir_of
from coordinators.sqlite.url import parse_url

__all__ = [
    "SqliteCoordinator",
    "SqliteSession",
    "dir_of",
    "parse_url",
    "read_boot_id",
    "translate",
]
