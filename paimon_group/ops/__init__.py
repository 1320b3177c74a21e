"""Operator tools: what ``paimon-group``'s operations commands and a member's
``/metrics`` are made of.

* :mod:`~paimon_group.ops.lag`: how far shards are behind their table;
* :mod:`~paimon_group.ops.report`: the typed ``describe`` report;
* :mod:`~paimon_group.ops.admin` (list, delete, members remove) and
  :mod:`~paimon_group.ops.reset`: every change through the group protocol
  (the operators' client, :class:`~paimon_group.protocol.admin.GroupAdmin`),
  no raw key commit;
* :mod:`~paimon_group.ops.metrics`: Prometheus metrics and probes of a member;
* :mod:`~paimon_group.ops.render`: rich tables for people.
"""
