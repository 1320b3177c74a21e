"""Reads and writes of small files (hints, consumer files, the group's origin)
at the fewest requests an object store allows.

pypaimon's ``FileIO`` asks before it acts: ``exists(path)`` then
``read_file_utf8(path)`` is a HEAD, then a HEAD and a GET, and an absent key
costs a HEAD *and* a LIST (pyarrow checks whether it is a directory);
``overwrite_file_utf8`` first checks the parent "directory" (a HEAD and a
LIST, on a store that has no directories). On an object store these helpers
go to pyarrow's file system directly:

* :func:`read_text`: open and read, an absent file is the open's
  ``FileNotFoundError``: one HEAD when absent, a HEAD and a GET when present;
* :func:`file_exists`: open without reading: one HEAD either way;
* :func:`write_text`: one upload, no directory check (pyarrow below 20, which
  pypaimon requires, uploads even a small file as a three-request multipart
  upload; that is pyarrow's floor here);
* :func:`write_whole`: :func:`write_text` such that a reader sees the old
  content or the new, never a part (an upload is all or nothing already).

On a local file system they do what pypaimon's calls do, except
:func:`write_whole`, which writes a temporary file and renames it over the
target (pypaimon's overwrite truncates then writes: a reader in between reads
``''``), and :func:`read_text` and :func:`file_exists`, which ask the
operating system directly: pypaimon's ``LocalFileIO`` parses every path it is
given as a URL (about 15 us a call, five times the ``stat`` itself); here a
directory's path is translated by it once (:func:`_local_path`), so a leader
that looks for the next snapshot of 200 tables every second, and checks
their identity every few, does not spend its time parsing their names.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import pyarrow.fs as pafs

__all__ = ["FileProbe", "file_exists", "file_signature", "is_object_store", "is_remote_fs",
           "local_directories", "local_names", "read_text", "sync_directory", "write_beside",
           "write_text", "write_whole"]


def is_remote_fs(fs: Any) -> bool:
    """Whether ``fs`` (a pyarrow file system) is an object store: anything but
    pyarrow's local file system."""
    base = fs.base_fs if isinstance(fs, pafs.SubTreeFileSystem) else fs
    return not isinstance(base, pafs.LocalFileSystem)


def _remote(file_io: Any) -> tuple[Any, Callable[[str], str]] | None:
    fs = getattr(file_io, "filesystem", None)
    to_fs_path = getattr(file_io, "to_filesystem_path", None)
    if fs is None or to_fs_path is None or not is_remote_fs(fs):
        return None
    return fs, to_fs_path


# file IO -> {directory as the store names it: its path on this machine}
_LOCAL_DIRS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()
_LOCAL_DIRS_LOCK = threading.Lock()
_LOCAL_DIRS_MAX = 4096  # per file IO: a few directories a table


@functools.cache
def _local_file_io() -> type[Any]:
    from pypaimon.filesystem.local_file_io import LocalFileIO

    local_class: type[Any] = LocalFileIO
    return local_class


# A file's name that no URL parsing changes (no quoting, query or fragment):
# Paimon's own names (snapshot-7, schema-0, LATEST, consumer-<id>, ...).
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.=+-]+")


def _local_path(file_io: Any, path: str) -> str | None:
    """``path`` on this machine when ``file_io`` is pypaimon's local file IO
    (or one of its kind, such as its FUSE mapping); None otherwise.

    The directory is translated by the file IO itself
    (``to_filesystem_path``: its URL parsing, a FUSE mount's prefix), once,
    and a plain name appended: a plain name in a directory is the same name
    under the directory's translation. That is checked when the directory is
    first seen (the whole path translated too): a directory for which it does
    not hold (a ``file:`` URL of a file at the root) has each path translated
    whole, as has a name that is not plain. Read without the lock (a dict's
    get is atomic); written under it."""
    if not isinstance(file_io, _local_file_io()):
        return None
    directory, slash, name = path.rpartition("/")
    if not slash or name in (".", "..") or not _PLAIN_NAME.fullmatch(name):
        return str(file_io.to_filesystem_path(path))
    local = _local_directory(file_io, directory, name)
    if not local:  # this directory's paths are translated whole
        return str(file_io.to_filesystem_path(path))
    return os.path.join(local, name)


def _local_directory(file_io: Any, directory: str, name: str) -> str:
    """The translation of ``directory`` (a local file IO's) to which a plain
    name is joined, or ``""`` when its paths are translated whole; checked
    with the plain ``name`` when the directory is first seen."""
    known = _LOCAL_DIRS.get(file_io)
    local = None if known is None else known.get(directory)
    if local is None:
        translated = str(file_io.to_filesystem_path(directory or "/"))
        whole = str(file_io.to_filesystem_path(f"{directory}/{name}"))
        local = translated if whole == os.path.join(translated, name) else ""
        with _LOCAL_DIRS_LOCK:
            known = _LOCAL_DIRS.setdefault(file_io, {})
            if len(known) >= _LOCAL_DIRS_MAX:
                known.clear()
            known[directory] = local
    return local


class FileProbe:
    """Whether files of one directory exist, asked often (a table's next
    snapshot, at every poll of every table a leader publishes): on a local
    file system the directory's translation (:func:`_local_path`) is kept
    here and a plain name joined to it, a ``stat`` and little more per
    question; any other name, and any other store, as :func:`file_exists`.
    Safe to share between threads (the translation, found once, is the same
    whichever thread finds it)."""

    __slots__ = ("_directory", "_file_io", "_prefix")

    def __init__(self, file_io: Any, directory: str) -> None:
        self._file_io, self._directory = file_io, directory
        # The translated directory with its separator; "": paths translated
        # whole, or not a local store; None: not known yet.
        self._prefix: str | None = None

    def exists(self, name: str) -> bool:
        if _PLAIN_NAME.fullmatch(name):
            prefix = self._prefix
            if prefix is None:
                local = (_local_directory(self._file_io, self._directory, name)
                         if isinstance(self._file_io, _local_file_io()) else "")
                prefix = self._prefix = os.path.join(local, "") if local else ""
            if prefix:
                return os.path.exists(prefix + name)
        return file_exists(self._file_io, f"{self._directory}/{name}")

    def exists_plain(self, name: str) -> bool:
        """:meth:`exists` of a name the caller built plain (``snapshot-7``:
        letters, digits, ``-``, ``_``, ``.``): once the directory's
        translation is known, one ``stat`` and nothing to match (a leader
        asks this of every table at every poll)."""
        prefix = self._prefix
        if not prefix:
            return self.exists(name)
        try:
            os.stat(prefix + name)
        except (OSError, ValueError):  # as os.path.exists
            return False
        return True


def local_directories(file_io: Any, path: str) -> list[str] | None:
    """The names of the directories in directory ``path`` (hidden ones too),
    as pypaimon's ``list_status`` finds them (a link to a directory is one),
    when ``file_io`` is a local file IO; None for any other store, and when
    a name is not plain (pypaimon quotes it in a ``file://`` URL's listing).
    A directory's entries carry their type: no ``stat`` per entry, no status
    object, where pypaimon's local listing makes both for each."""
    return _scan(file_io, path, _is_dir)


def local_names(file_io: Any, path: str) -> list[str] | None:
    """The names of every entry of directory ``path``, as
    :func:`local_directories` lists them (``[]`` for a directory that does
    not exist; None for any other store and for a name that is not plain)."""
    return _scan(file_io, path, None)


def _scan(file_io: Any, path: str,
          keep: Callable[[os.DirEntry[str]], bool] | None) -> list[str] | None:
    if not isinstance(file_io, _local_file_io()):
        return None
    try:
        with os.scandir(file_io.to_filesystem_path(path)) as entries:
            names = [e.name for e in entries if keep is None or keep(e)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return names if all(map(_PLAIN_NAME.fullmatch, names)) else None


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # gone since the listing
        return False


def is_object_store(file_io: Any) -> bool:
    """Whether pypaimon's ``file_io`` reaches an object store."""
    return _remote(file_io) is not None


def read_text(file_io: Any, path: str) -> str | None:
    """The text of ``path``, or None if it does not exist."""
    local = _local_path(file_io, path)
    if local is not None:
        try:
            with open(local, "rb") as source:  # as pypaimon reads: no newline translation
                return source.read().decode("utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
    remote = _remote(file_io)
    if remote is None:
        if not file_io.exists(path):
            return None
        try:
            return str(file_io.read_file_utf8(path))
        except FileNotFoundError:  # deleted between the two calls
            return None
    fs, to_fs_path = remote
    try:
        with fs.open_input_stream(to_fs_path(path)) as source:
            data: bytes = source.read()
    except FileNotFoundError:
        return None
    return data.decode("utf-8")


def file_exists(file_io: Any, path: str) -> bool:
    """Whether the file ``path`` exists (a file, not a directory)."""
    local = _local_path(file_io, path)
    if local is not None:
        return os.path.exists(local)
    remote = _remote(file_io)
    if remote is None:
        return bool(file_io.exists(path))
    fs, to_fs_path = remote
    try:
        fs.open_input_stream(to_fs_path(path)).close()
    except FileNotFoundError:
        return False
    return True


def file_signature(file_io: Any, path: str) -> tuple[int, ...] | None:
    """Which file ``path`` is, on a local file system: its device, inode,
    size, modification and change times (ns); None when it is absent, or on
    any other store (which has no such cheap answer). A file written once
    and never changed keeps its signature; a file removed and written again
    under its name has another (a new change time, and as a rule a new inode),
    so an equal signature is the very file read before."""
    local = _local_path(file_io, path)
    if local is None:
        return None
    try:
        st = os.stat(local)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def write_text(file_io: Any, path: str, text: str) -> None:
    """Write ``path`` whole (an object store's upload is all or nothing)."""
    remote = _remote(file_io)
    if remote is None:
        file_io.overwrite_file_utf8(path, text)
        return
    fs, to_fs_path = remote
    with fs.open_output_stream(to_fs_path(path)) as sink:
        sink.write(text.encode("utf-8"))


def write_whole(file_io: Any, path: str, text: str) -> None:
    """Write ``path`` so that a reader sees the old content or the new, never
    a part.

    On a local file system: a temporary file ``.<name>.<random>.tmp`` in the
    same directory, renamed over ``path`` (``os.replace`` is atomic), created
    with the mode a plain write gives (0666 less the umask: Paimon's engine,
    perhaps another user, reads consumer files). Its leading dot keeps it out
    of every listing by prefix: Paimon's consumer listing (``consumer-*``, in
    Java and in pypaimon's ``ConsumerManager``), expiration and tools never
    see it. Elsewhere: :func:`write_text` (an object store's upload is all or
    nothing; a file system that is neither writes in place, and readers read
    a file that does not parse again, as :mod:`paimon_group.reading.mirror`
    does).
    """
    parsed = urlparse(path)
    if _remote(file_io) is not None or parsed.scheme not in ("", "file"):
        write_text(file_io, path, text)
        return
    target = parsed.path if parsed.scheme == "file" else path
    temporary = write_beside(target, text)
    try:
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_beside(target: str, text: str, *, sync: bool = False) -> str:
    """Write ``text`` to a new temporary file ``.<name>.<random>.tmp`` in the
    local directory of ``target`` (made if missing), with the mode a plain
    write gives; its path. The caller renames or links it to ``target``, and
    removes it.

    ``sync``: the file's text is on disk when this returns (``fsync``), and
    so is the name of the directory if this made it (its parent synced): a
    crash of the host after the caller linked or renamed it, and synced the
    directory (:func:`sync_directory`), loses neither."""
    directory, name = os.path.split(target)
    directory = directory or "."
    made = sync and not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    if made:
        sync_directory(os.path.dirname(os.path.abspath(directory)))
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return temporary


def sync_directory(directory: str) -> None:
    """Put ``directory``'s entries (a name just linked, renamed or made in
    it) on disk: ``fsync`` of the directory (POSIX; a no-op where a
    directory cannot be opened, on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except (PermissionError, IsADirectoryError):  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
