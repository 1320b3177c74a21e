"""Placeholder: the etcd server fixture is being written."""
