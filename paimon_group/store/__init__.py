"""The warehouse's files, below everything but the errors.

* :mod:`~paimon_group.store.files`: small files (hints, consumer files, the
  group's origin) read and written without pypaimon's directory checks;
* :mod:`~paimon_group.store.handed_over`: metadata files the group's head
  read once and handed over to the members' planners;
* :mod:`~paimon_group.store.object_store`: bounded object-store requests, and
  one line when the store fails;
* :mod:`~paimon_group.store.exclusive`: a file created only if its name is
  free (a sink's snapshot commit), on a local file system or on S3 (a store
  that honours ``If-None-Match``).
"""
