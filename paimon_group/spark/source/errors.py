"""Our one-line error, out of the exception Spark wraps it in.

An error raised by the source inside Spark (a bad option when the query is
defined, a member that failed while the query runs) reaches the caller as a
``pyspark`` exception (``AnalysisException``, ``StreamingQueryException``)
whose message holds the whole Python traceback of the source. Our own errors
are one line already; :func:`error_line` finds that line, so a program can
print ``error: <line>`` instead of forty lines of Spark.

Example::

    try:
        df = spark.readStream.format("paimon-group").option("group", "bad/name").load()
    except Exception as err:
        line = error_line(err)      # "invalid group name 'bad/name': use 1 to 128 ..."
        if line is None:
            raise
        sys.exit(f"error: {line}")
"""

from __future__ import annotations

import re

__all__ = ["error_line"]

# The last line of a traceback of one of our errors, as Python prints it:
# ``coordinators.errors.ConfigError: ...`` or ``paimon_group.errors.X: ...``.
_OURS = re.compile(r"^(?:coordinators|paimon_group)(?:\.\w+)+: (?P<text>.+)$", re.MULTILINE)


def error_line(err: BaseException) -> str | None:
    """The one line of our error inside ``err`` (a Spark exception, or ours
    directly), without Spark's trailing SQLSTATE; None if there is none."""
    from coordinators.errors import PaimonGroupError

    if isinstance(err, PaimonGroupError):
        return str(err).splitlines()[0] if str(err) else type(err).__name__
    matches = list(_OURS.finditer(str(err)))
    if not matches:
        return None
    text = matches[-1].group("text")
    return re.sub(r"\s+SQLSTATE: \w+\s*$", "", text).strip()
