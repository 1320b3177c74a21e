"""Shard batches as Spark DataFrames: ``paimon-group run --spark-handler MODULE:CALLABLE``.

:class:`SparkBatchHandler` is a member handler (called with each
:class:`~paimon_group.reading.batch.ShardBatch`) that turns the batch into a Spark
DataFrame and calls the user's function with ``(df, batch)``. The rows go
from Paimon to Spark through Arrow only: the batch is read as one
``pyarrow.Table`` and handed to Spark 4's ``spark.createDataFrame(table)``,
which ships the Arrow record batches to the JVM (or, with Spark Connect, to
the server) as they are; no row is ever turned into a Python object.

The SparkSession is the user's (``spark=``), or built once per process from
a master URL (default ``local[*]``) or a Spark Connect address
(``sc://HOST:PORT``), and stopped by :meth:`SparkBatchHandler.close` (the
member runtime calls it after the member stopped). A session built here
also has Arrow enabled for pandas conversions, with the silent fallback to
row-by-row conversion disabled, so user code that calls
``createDataFrame(pandas_df)`` or ``toPandas()`` fails loudly instead of
crawling.

The position of a batch is committed (fenced by ``batch.epoch``) after the
user's function returns, so the function must finish its writes (run a
Spark action) before returning: delivery is at-least-once. For sinks that
make replays harmless see :mod:`paimon_group.spark.sinks` and ``docs/spark.md``.
A sink that refuses a stale writer raises :class:`~paimon_group.errors.StaleEpoch`;
the handler then returns without retrying (nothing was written, and the
member's fenced commit of that batch is rejected the same way), so a
member that lost a shard drops it instead of failing.

PySpark is an optional extra (``pip install '.[spark]'`` in the clone); it is
imported only when a session is needed.

Example (``my_jobs.py``, run with ``paimon-group run --group g --warehouse /wh
--table db.orders --spark-handler my_jobs:handle``)::

    from pyspark.sql import functions as F
    from paimon_group.spark.sinks import ParquetBatchSink

    sink = ParquetBatchSink("/data/out/order_totals")

    def handle(df, batch):
        totals = df.groupBy("customer_id").agg(F.sum("amount").alias("amount"))
        sink.write(totals, batch)       # replaces an earlier attempt of this batch

Or in-process::

    handler = SparkBatchHandler(lambda df, batch: df.count(), master="local[2]")
    try:
        run_member(MemberConfig(group="g", warehouse="/wh", table="db.orders"), handler)
    finally:
        handler.close()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from coordinators.errors import ConfigError, PaimonGroupError
from coordinators.urls import redact_url
from paimon_group.errors import StaleEpoch

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from paimon_group.reading.batch import ShardBatch
    from paimon_group.spark.source import PaimonGroupDataSource as PaimonGroupDataSource

__all__ = [
    "ARROW_CONF",
    "PaimonGroupDataSource",
    "SparkBatchHandler",
    "SparkFunction",
    "arrow_to_dataframe",
    "build_spark_session",
    "spark_handler_from_spec",
]

log = logging.getLogger("paimon_group.spark")

SparkFunction = Callable[["DataFrame", "ShardBatch"], Any]
"""The user's function: called with the batch as a DataFrame, and the batch."""

ARROW_CONF: Mapping[str, str] = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
}
"""Set on every classic (non-Connect) session this module builds (see the module docstring)."""

_INSTALL_HINT = "install the extra: pip install '.[spark]' (run in the clone)"


def _import_pyspark() -> Any:
    """``pyspark.sql.SparkSession``, or one clear ConfigError line."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise ConfigError(f"Spark handlers need PySpark (>= 4.0); {_INSTALL_HINT}") from err
    return SparkSession


def build_spark_session(
    *,
    master: str = "local[*]",
    remote: str | None = None,
    app_name: str = "paimon-group",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """A SparkSession for this process: local/cluster ``master``, or Spark Connect ``remote``.

    Uses ``getOrCreate``, so a session the process already has is reused.
    Settings from ``SPARK_CONF_DIR/spark-defaults.conf`` apply as usual;
    ``conf`` and :data:`ARROW_CONF` come on top. Raises ConfigError for a
    missing PySpark or a malformed address, and a retriable
    :class:`PaimonGroupError` when Spark cannot be started or reached.

    Example::

        spark = build_spark_session(master="local[2]", conf={"spark.ui.enabled": "false"})
    """
    session_cls = _import_pyspark()
    if remote is not None and not remote.startswith("sc://"):
        raise ConfigError(f"--spark-remote {redact_url(remote)!r} must be a Spark Connect "
                          "address sc://HOST:PORT")
    # A Connect address may carry a token (sc://h:15002/;token=...): shown redacted.
    where = f"Spark Connect server {redact_url(remote)}" if remote else f"Spark master {master!r}"
    try:
        builder = session_cls.builder.appName(app_name)
        builder = builder.remote(remote) if remote else builder.master(master)
        if remote:
            spark = builder.getOrCreate()
            # Connect sessions are lazy: reach the server now, and set the
            # session's SQL settings there (static ones cannot be changed).
            # ARROW_CONF does not apply: a Connect client always converts
            # through Arrow, and has no row-by-row fallback to disable.
            for key, value in (conf or {}).items():
                spark.conf.set(key, value)
            _ = spark.version
        else:
            for key, value in {**dict(conf or {}), **ARROW_CONF}.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            # getOrCreate on an existing session ignores the builder's settings.
            for key, value in ARROW_CONF.items():
                spark.conf.set(key, value)
    except ImportError as err:
        # Spark Connect needs grpcio, grpcio-status, googleapis-common-protos.
        raise ConfigError(
            f"cannot use {where}: a Spark Connect dependency is missing ({err}); "
            "pip install 'pyspark[connect]'"
        ) from err
    except Exception as err:  # Py4J / gRPC / JVM start-up errors
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if remote:
            first_line = first_line.replace(remote, redact_url(remote))
        raise PaimonGroupError(
            f"cannot start a Spark session on {where}: {type(err).__name__}: {first_line}",
            retriable=True,
        ) from err
    return spark  # type: ignore[no-any-return]


def arrow_to_dataframe(spark: SparkSession, table: pa.Table) -> DataFrame:
    """``table`` as a DataFrame with the same columns, types and nullability, via Arrow.

    Spark 4's ``createDataFrame(pyarrow.Table)`` slices the table into record
    batches and ships them as an Arrow stream; unlike the pandas path it has
    no fallback to row-by-row conversion (``tests/test_spark.py`` checks that
    the row-by-row code paths are never entered).
    """
    return spark.createDataFrame(table)


class SparkBatchHandler:
    """A member handler that calls ``fn(df, batch)`` with each batch as a DataFrame.

    ``spark``: the user's session (never stopped here); otherwise one is built
    on first use (or by :meth:`start`) from ``master`` or ``remote``, with
    ``conf``, and stopped by :meth:`close`. Thread-safe: the member calls the
    handler from worker threads.

    Example::

        from paimon_group import MemberConfig, run_member
        from paimon_group.spark.handler import SparkBatchHandler

        def count(df, batch):
            print(batch.shard, batch.snapshot_id, df.count())

        handler = SparkBatchHandler(count, master="local[2]")
        try:
            run_member(MemberConfig(group="g", warehouse="/wh", table="db.t"), handler)
        finally:
            handler.close()
    """

    def __init__(
        self,
        fn: SparkFunction,
        spark: SparkSession | None = None,
        *,
        master: str = "local[*]",
        remote: str | None = None,
        conf: Mapping[str, str] | None = None,
        app_name: str = "paimon-group",
    ) -> None:
        if not callable(fn):
            raise ConfigError(f"spark handler {fn!r} is not callable")
        self.fn = fn
        self.master = master
        self.remote = remote
        self.conf = dict(conf or {})
        self.app_name = app_name
        self._spark: SparkSession | None = spark
        self._owns_session = spark is None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        where = redact_url(self.remote) if self.remote else self.master
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        owner = "own session" if self._owns_session else "user session"
        return f"SparkBatchHandler({name}, {owner} on {where})"

    def start(self) -> SparkSession:
        """The session, built now if needed (so start-up errors surface before joining)."""
        with self._lock:
            if self._closed:
                raise PaimonGroupError("this Spark handler was closed")
            if self._spark is None:
                self._spark = build_spark_session(
                    master=self.master, remote=self.remote, app_name=self.app_name, conf=self.conf
                )
                log.info("Spark session started on %s",
                         redact_url(self.remote) if self.remote else self.master)
            return self._spark

    @property
    def spark(self) -> SparkSession:
        return self._spark if self._spark is not None else self.start()

    def to_dataframe(self, batch: ShardBatch) -> DataFrame:
        """Exactly the batch's rows and schema (``_row_kind`` first when requested)."""
        return arrow_to_dataframe(self.spark, batch.to_arrow())

    def __call__(self, batch: ShardBatch) -> Any:
        df = self.to_dataframe(batch)
        try:
            return self.fn(df, batch)
        except StaleEpoch as err:
            # The sink saw a newer owner of this shard: nothing was written,
            # and the member's commit (fenced by the same epoch) will be
            # rejected, dropping the shard. Retrying would only fail again.
            log.warning(
                "shard %d: sink refused batch @%d of epoch %d: %s",
                batch.shard, batch.snapshot_id, batch.epoch, err,
                extra={"group": batch.group, "shard": batch.shard, "epoch": batch.epoch},
            )
            return None

    def close(self) -> None:
        """Stop the session if it was built here. Idempotent."""
        with self._lock:
            self._closed = True
            spark, self._spark = self._spark, None
        if spark is not None and self._owns_session:
            if _jvm_exited(spark):
                # A SIGTERM sent to the whole process group (a terminal,
                # ``timeout``) reaches the JVM too; there is nothing to stop.
                log.info("the Spark JVM has already exited")
                return
            try:
                spark.stop()
            except Exception:  # stopping is best effort on exit
                log.warning("stopping the Spark session failed", exc_info=True)

    def __enter__(self) -> SparkBatchHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _jvm_exited(spark: SparkSession) -> bool:
    """True when the local JVM of a classic session is gone (never for Spark Connect)."""
    try:
        gateway: Any = spark.sparkContext._gateway
        proc = gateway.proc
    except Exception:  # Spark Connect has no SparkContext; older layouts: assume alive
        return False
    return proc is not None and proc.poll() is not None


def spark_handler_from_spec(
    spec: str,
    *,
    master: str = "local[*]",
    remote: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkBatchHandler:
    """The handler for ``--spark-handler MODULE:CALLABLE``, its session already started.

    Example::

        handler = spark_handler_from_spec("my_jobs:handle", master="local[2]")
    """
    from paimon_group.process.handlers import load_callable

    _import_pyspark()  # one clear line before importing user code that needs it
    fn = load_callable(spec, what="spark handler")
    handler = SparkBatchHandler(fn, master=master, remote=remote, conf=conf)
    handler.start()
    return handler


def __getattr__(name: str) -> Any:
    # The streaming source needs PySpark at import: loaded on first use only.
    if name == "PaimonGroupDataSource":
        from paimon_group.spark.source import PaimonGroupDataSource

        return PaimonGroupDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
