"""Placeholder: the zk server fixture is being written."""
