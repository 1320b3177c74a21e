"""The project's releases, as CHANGELOG.md records them, and the previous one's code.

CHANGELOG.md has one ``## `` heading per release, newest first::

    ## Unreleased (0.2.0)
    ## 0.1.0 (2026-11-23, commit 9a66f3523a74a54793dde1b17feccb684622c741)

(at a release's own commit its heading has only the date: the commit is
recorded by the next one, docs/releasing.md). A release is found by its tag
``v<version>`` when the clone has tags, and otherwise by the commit its
heading records (a clone without tags still has the history).
:func:`extract_release` writes the release's packages
(``paimon_group`` and ``coordinators``, nothing else: the tests' own helpers
stay main's) into a directory with ``git archive``; a process with that
directory first on its path runs the release, with the dependencies of the
shared virtualenv.

Example::

    >>> newest_heading(REPO / "CHANGELOG.md").version  # doctest: +SKIP
    '0.2.0'
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"

_HEADING = re.compile(
    r"^## (?:(?P<unreleased>Unreleased) \((?P<next>[0-9][^)]*)\)"
    r"|(?P<version>[0-9][^ ]*) \((?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2})"
    r"(?:, commit (?P<commit>[0-9a-f]{40}))?\))\s*$")


@dataclass(frozen=True)
class Heading:
    version: str
    unreleased: bool
    commit: str = ""


def headings(path: Path = CHANGELOG) -> list[Heading]:
    """Every release heading of the changelog, newest first."""
    return parse_headings(path.read_text())


def parse_headings(text: str) -> list[Heading]:
    """:func:`headings` of a changelog's text (a commit's, read from git)."""
    out: list[Heading] = []
    for line in text.splitlines():
        if not line.startswith("## "):
            continue
        m = _HEADING.match(line)
        if m is None:
            raise AssertionError("CHANGELOG.md: a release heading not in the form "
                                 f"'## Unreleased (X.Y.Z)' or '## X.Y.Z (YYYY-MM-DD[, commit "
                                 f"SHA])': {line!r}")
        if m["unreleased"]:
            out.append(Heading(m["next"], True))
        else:
            out.append(Heading(m["version"], False, m["commit"] or ""))
    return out


def newest_heading(path: Path = CHANGELOG) -> Heading:
    return headings(path)[0]


def previous_release(path: Path = CHANGELOG) -> Heading:
    """The newest release before this tree's version (at a release's own
    commit, the one before it)."""
    from paimon_group.version import __version__

    return next(h for h in headings(path) if not h.unreleased and h.version != __version__)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def tag_commit(version: str) -> str | None:
    """The commit of tag ``v<version>``, None when the clone has no such tag."""
    tag = subprocess.run(["git", "rev-parse", "--verify", "-q", f"v{version}^{{commit}}"],
                         cwd=REPO, capture_output=True, text=True)
    return tag.stdout.strip() if tag.returncode == 0 else None


def release_commit(release: Heading) -> str:
    """The release's commit: its tag's when the tag is present (and then it
    must be the recorded one), else the commit the changelog records."""
    commit = tag_commit(release.version)
    if commit is not None:
        if release.commit and commit != release.commit:
            raise AssertionError(f"tag v{release.version} is at {commit}; CHANGELOG.md "
                                 f"records {release.commit}")
        return commit
    if not release.commit:
        raise AssertionError(f"release {release.version} has no tag in this clone and "
                             "CHANGELOG.md records no commit for it")
    try:
        _git("cat-file", "-e", f"{release.commit}^{{commit}}")
    except subprocess.CalledProcessError as err:
        raise AssertionError(f"release {release.version}'s commit {release.commit} is not in "
                             "this clone's history (a shallow clone?)") from err
    return release.commit


_VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)


def version_at(commit: str) -> str:
    """The package version of ``commit``'s tree (paimon_group/version.py, or
    paimon_group/__init__.py before that file existed)."""
    for path in ("paimon_group/version.py", "paimon_group/__init__.py"):
        try:
            m = _VERSION_LINE.search(file_at(commit, path))
        except subprocess.CalledProcessError:
            continue
        if m:
            return m.group(1)
    raise AssertionError(f"no __version__ in {commit}'s tree")


def file_at(commit: str, path: str) -> str:
    return _git("show", f"{commit}:{path}")


PACKAGES = ("paimon_group", "coordinators")


def extract_release(release: Heading, into: Path, paths: tuple[str, ...] = PACKAGES) -> Path:
    """The release's ``paths`` (its packages) written under ``into``; returns ``into``."""
    commit = release_commit(release)
    data = subprocess.run(["git", "archive", "--format=tar", commit, *paths],
                          cwd=REPO, capture_output=True, check=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def install_release(release: Heading, into: Path) -> Path:
    """The release installed from its tree into a virtualenv of its own under
    ``into``, as a user installs it; returns the ``paimon-group`` script.

    Its dependencies come from the running interpreter's environment (a
    ``.pth`` file), so nothing but the release itself is installed (pip builds
    it with its own build requirements, in an isolated build environment, as
    ``pip install`` does). The running environment's own ``paimon_group`` is
    not seen: the release's site-packages come first, and an editable install
    of the running tree is a ``.pth`` file of that environment, which a
    directory added by a ``.pth`` line does not read.
    """
    import sysconfig
    import venv

    source = extract_release(release, into / "source", paths=(
        *PACKAGES, "pyproject.toml", "README.md"))
    env = into / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    shared = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "shared-dependencies.pth").write_text(shared + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "-q", "--no-deps", str(source)], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"installing release {release.version} failed:\n"
                             f"{done.stderr[-3000:]}")
    return env / "bin" / "paimon-group"
