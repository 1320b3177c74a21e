"""The group protocol over the coordinator protocol: the one package that writes the
group's keys.

* :mod:`~paimon_group.protocol.names`: group names, member ids, the key layout;
* :mod:`~paimon_group.protocol.records`: the typed records stored as values;
* :mod:`~paimon_group.protocol.sharding`: the group's sharding rule;
* :mod:`~paimon_group.protocol.assignor`, :mod:`~paimon_group.protocol.load_assignor`
  and :mod:`~paimon_group.protocol.static_membership`: the pure assignment;
* :mod:`~paimon_group.protocol.identity`: the table's identity, stored with the group;
* the writers, one per family of the group's keys, and the only modules
  that write them: :mod:`~paimon_group.protocol.membership` (the group
  record, members, goodbyes, leadership, the assignment),
  :mod:`~paimon_group.protocol.ownership` (owner keys, positions),
  :mod:`~paimon_group.protocol.table_head`, :mod:`~paimon_group.protocol.group_start`
  and :mod:`~paimon_group.protocol.sinks`; :mod:`~paimon_group.protocol.releasing`
  keeps the releases still due and makes them through the ownership writer;
* :mod:`~paimon_group.protocol.group` (:class:`GroupClient`, the member's
  client), :mod:`~paimon_group.protocol.admin` (``GroupAdmin``, the
  operators'), :mod:`~paimon_group.protocol.group_reads` and
  :mod:`~paimon_group.protocol.group_views`: what both read.
"""
