"""The release this code is (docs/releasing.md): ``X.Y.Z`` at a release's
commit, ``X.Y.Z.devN`` on main between releases (``X.Y.Z`` the next release).
``paimon-group --version`` also names the commit of a development build run
from a git checkout (:mod:`paimon_group.cli.version`)."""

__version__ = "0.2.0.dev0"
