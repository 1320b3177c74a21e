"""Benchmarks of paimon-group (not collected by pytest): ``python -m tests.benchmarks.run``."""
