"""What a member is told: its configuration, its columns, its warehouse.

* :mod:`paimon_group.config.member`: :class:`MemberConfig` and the coordinator
  a warehouse implies.
* :mod:`paimon_group.config.projection`: the columns a member reads.
* :mod:`paimon_group.config.warehouses`: which warehouse a URI names, and
  where its host-local coordinator lives.

``from paimon_group import MemberConfig`` is the public path.
"""
