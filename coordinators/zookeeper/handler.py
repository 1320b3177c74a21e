"""kazoo's threading handler, waiting with one ``poll(2)`` instead of a new epoll each time.

kazoo's connection thread waits for its socket with the handler's
``select``, called before every request it sends and every reply it reads.
Since kazoo 2.9 that ``select`` builds a new ``selectors.DefaultSelector``
each call: on Linux an epoll instance, so every wait is five system calls
(``epoll_create``, two ``epoll_ctl``, ``epoll_wait``, ``close``) and a
Python object made and dropped. Profiled with 100 members (100 kazoo
clients) in one process during rebalances (docs/benchmarks.md (14)), the
connection threads spent about two thirds of their samples there.

The same kazoo function (:func:`kazoo.handlers.utils.selector_select`, so
its semantics are kazoo's own: ready lists, errors, timeouts) is given
:class:`selectors.PollSelector` as its default: registering is bookkeeping in
the process and the wait one ``poll`` call, with no descriptor to create or
close; unlike ``select(2)`` it has no limit on descriptor numbers (the
reason kazoo left ``select.select``).
"""

from __future__ import annotations

import selectors
from types import SimpleNamespace
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import selector_select

# The part of the ``selectors`` module ``selector_select`` uses.
_POLL_SELECTORS = SimpleNamespace(
    EVENT_READ=selectors.EVENT_READ,
    EVENT_WRITE=selectors.EVENT_WRITE,
    DefaultSelector=selectors.PollSelector,
)


class PollingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's :class:`SequentialThreadingHandler`, its ``select`` on ``poll(2)``."""

    def select(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("selectors_module", _POLL_SELECTORS)
        return selector_select(*args, **kwargs)
