"""The group protocol, written once over the coordinator protocol.

* :mod:`~paimon_group.protocol.names`: group names, member ids, the key layout;
* :mod:`~paimon_group.protocol.records`: the typed records stored as values;
* :mod:`~paimon_group.protocol.sharding`: the group's sharding rule;
* :mod:`~paimon_group.protocol.assignor`, :mod:`~paimon_group.protocol.load_assignor`
  and :mod:`~paimon_group.protocol.static_membership`: the pure assignment;
* :mod:`~paimon_group.protocol.identity`: the table's identity, stored with the group;
* :mod:`~paimon_group.protocol.group` (:class:`GroupClient`),
  :mod:`~paimon_group.protocol.group_views`, :mod:`~paimon_group.protocol.group_start`
  and :mod:`~paimon_group.protocol.releasing`: membership, leadership,
  ownership and progress.
"""
