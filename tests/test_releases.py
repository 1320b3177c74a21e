"""The version, ``--version`` and CHANGELOG.md agree (the rule: docs/releasing.md).

* main between releases is ``X.Y.Z.devN`` and CHANGELOG.md's newest heading is
  ``Unreleased (X.Y.Z)``; at a release's commit the version is ``X.Y.Z`` and
  the newest heading ``X.Y.Z (DATE)``;
* every earlier release whose commit this clone has (by its tag, or by the
  commit its heading records) had that version in its tree, and its tag, when
  present, is at the recorded commit;
* ``--version`` prints the version, and for a development build run from a
  git checkout the commit.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from paimon_group.cli.version import version_text
from paimon_group.version import __version__
from tests.support.releases import (
    CHANGELOG,
    REPO,
    file_at,
    headings,
    parse_headings,
    release_commit,
    version_at,
)

_DEV = re.compile(r"^(\d+\.\d+\.\d+)\.dev\d+$")
_RELEASE = re.compile(r"^\d+\.\d+\.\d+$")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:3])


def test_the_version_is_the_changelogs_newest_heading() -> None:
    newest = headings()[0]
    dev = _DEV.match(__version__)
    if dev:
        assert newest.unreleased and newest.version == dev.group(1), (
            f"version {__version__} is a development build of {dev.group(1)}: CHANGELOG.md's "
            f"newest heading must be 'Unreleased ({dev.group(1)})', not {newest}")
    else:
        assert _RELEASE.match(__version__), f"version {__version__}: X.Y.Z or X.Y.Z.devN"
        assert not newest.unreleased and newest.version == __version__, newest


def test_the_package_version_is_read_from_the_version_module() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text
    assert 'version = {attr = "paimon_group.version.__version__"}' in text
    import paimon_group

    assert paimon_group.__version__ == __version__


def test_releases_are_in_order_and_each_is_what_its_commit_says() -> None:
    all_headings = headings()
    assert [h for h in all_headings[1:] if h.unreleased] == [], "one Unreleased, at the top"
    versions = [_key(h.version) for h in all_headings]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    released = [h for h in all_headings if not h.unreleased]
    assert released, "CHANGELOG.md records no release"
    for h in released[1:] if not all_headings[0].unreleased else released:
        commit = release_commit(h)  # its tag's (at the recorded commit), or the recorded one
        assert version_at(commit) == h.version, (h, commit)
        try:
            at_release = parse_headings(file_at(commit, "CHANGELOG.md"))
        except subprocess.CalledProcessError:
            continue  # 0.1.0 had no changelog
        assert at_release[0].version == h.version and not at_release[0].unreleased, at_release


def test_version_names_a_development_builds_commit(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "paimon_group", "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip()
    if ".dev" in __version__:
        assert re.fullmatch(
            rf"paimon-group, version {re.escape(__version__)} \(development build, "
            rf"commit {head}\+?\)\n", out.stdout), out.stdout
    else:
        assert out.stdout == f"paimon-group, version {__version__}\n"
    # Outside a checkout a development build says so without a commit; a
    # release never names one.
    assert version_text("0.2.0.dev0", tmp_path) == "0.2.0.dev0 (development build)"
    assert version_text("0.2.0", REPO) == "0.2.0"


@pytest.mark.parametrize("text", ["## 0.3.0", "## Unreleased", "## 0.1.0 (23 Nov)"])
def test_a_malformed_heading_is_named(text: str) -> None:
    with pytest.raises(AssertionError, match="release heading"):
        parse_headings(text)


def test_the_changelog_names_the_records_of_each_release() -> None:
    text = CHANGELOG.read_text()
    for h in headings():
        section = text.split(f"## {'Unreleased (' + h.version if h.unreleased else h.version}",
                             1)[1].split("\n## ", 1)[0]
        assert "### Records and files" in section, f"{h.version}: no 'Records and files'"


def test_the_previous_release_is_found_without_tags(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone without tags (CI's may have none) finds the previous release by
    the commit CHANGELOG.md records, and extracts it from the history."""
    from tests.support import releases

    monkeypatch.setattr(releases, "tag_commit", lambda version: None)
    previous = releases.previous_release()
    assert releases.release_commit(previous) == previous.commit
    tree = releases.extract_release(previous, tmp_path / "previous")
    text = (tree / "paimon_group" / "__init__.py").read_text()
    version_file = tree / "paimon_group" / "version.py"
    if version_file.exists():
        text = version_file.read_text()
    assert f'__version__ = "{previous.version}"' in text
    assert not (tree / "tests").exists()  # the tests' helpers stay main's
