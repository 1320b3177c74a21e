"""Running one member as a process: the runner, progress, preflight, logs."""
