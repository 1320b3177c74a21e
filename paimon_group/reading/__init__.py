"""The reading side: from a table's snapshots to what a handler receives.

* :mod:`~paimon_group.reading.table` (:class:`ShardedTable`) and
  :mod:`~paimon_group.reading.start`: the table, its snapshots, start positions;
* :mod:`~paimon_group.reading.steps` and :mod:`~paimon_group.reading.planner`:
  shard-exact plans, one per step;
* :mod:`~paimon_group.reading.read_view` and
  :mod:`~paimon_group.reading.pypaimon_read`: the readers of a schema version;
* :mod:`~paimon_group.reading.engine_reads`: pypaimon's reader made to read as
  the engine, installed when a table is opened (nothing at import);
* :mod:`~paimon_group.reading.batch` (:class:`ShardBatch`): what a handler receives;
* :mod:`~paimon_group.reading.shard_load`: each shard's load, for the load assignor;
* :mod:`~paimon_group.reading.mirror` and :mod:`~paimon_group.reading.consumer_meta`:
  the Paimon consumer files that mirror the committed positions.
"""
