"""Suite-wide fixtures. Real servers are started by the plugins below, on free
loopback ports; in CI (``CI=true``) a missing server binary fails, never skips."""

pytest_plugins = [
    "tests.support.etcd_server",
    "tests.support.zk_server",
]
