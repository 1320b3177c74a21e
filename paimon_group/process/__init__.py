"""One member as a process, above the member and the operator tools.

* :mod:`~paimon_group.process.runner`: signals, graceful handoff, exit codes;
* :mod:`~paimon_group.process.progress`: the progress line;
* :mod:`~paimon_group.process.preflight`: the checks made before anything is
  joined or created;
* :mod:`~paimon_group.process.logs`: text or JSON-lines logging;
* :mod:`~paimon_group.process.handlers`: loading ``MODULE:CALLABLE`` handlers;
* :mod:`~paimon_group.process.demo`: ``paimon-group demo``.
"""
