"""The former name of :mod:`coordinators.protocol`, kept for existing imports.

``coordinators.base`` *is* ``coordinators.protocol`` (the same module object),
so an import, an ``isinstance`` check or a patched attribute through either
name sees the other.
"""

import sys

from coordinators import protocol
from coordinators.protocol import *  # noqa: F403  (the names, for type checkers)
from coordinators.protocol import validate_dir, validate_key  # noqa: F401

sys.modules[__name__] = protocol
