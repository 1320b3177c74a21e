"""Spark: the handler path, the sinks, the streaming source."""
