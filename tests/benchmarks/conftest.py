"""Benchmarks are scripts, not tests: keep pytest from collecting them."""

collect_ignore_glob = ["bench_*.py", "run.py", "common.py", "workers.py"]
