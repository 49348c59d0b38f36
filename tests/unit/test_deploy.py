"""The deployment files agree with the guard they deploy: the Kubernetes ConfigMap is a
valid serve config whose ports, secrets, replicas and drain time match the Deployment and
the Dockerfile, and every metric the Grafana dashboard queries is one the guard exposes.
(Schema and static IaC checks of the same files — kubernetes-validate, checkov — run in
.ci/run.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from floorguard.errors import ConfigError
from floorguard.proxy.config.guard import load_config
from floorguard.proxy.edge.identity import create_identity
from floorguard.proxy.process.admin import admin_token
from floorguard.proxy.process.app import GuardServer

DEPLOY = Path(__file__).parents[2] / "deploy"


def _manifests() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            out[doc["kind"], doc["metadata"].get("name", "")] = doc
    return out


def _guard_config(tmp_path, monkeypatch):
    manifests = _manifests()
    text = manifests["ConfigMap", "floorguard-config"]["data"]["guard.yaml"]
    path = tmp_path / "guard.yaml"
    path.write_text(text)
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 32)
    monkeypatch.setenv("FLOORGUARD_ADMIN_TOKEN", "t" * 16)
    return load_config(path), manifests


def test_the_manifests_match_the_guard_config_they_ship(tmp_path, monkeypatch):
    config, manifests = _guard_config(tmp_path, monkeypatch)
    kustomized = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    listed = {p for p in kustomized["resources"]}
    assert listed == {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {
        "kustomization.yaml",
        "secret.example.yaml",  # the operator creates the Secret: never applied unedited
    }
    deployment = manifests["Deployment", "floorguard"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": config.port, "admin": config.admin.port}
    assert config.host == "0.0.0.0" and config.admin.host == "0.0.0.0"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert spec["securityContext"]["runAsNonRoot"] is True
    pause_s = float(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert spec["terminationGracePeriodSeconds"] > pause_s + config.drain_timeout_s
    assert config.store is not None and config.store.replicas == deployment["spec"]["replicas"]
    secret = manifests["Secret", "floorguard-secrets"]["stringData"]
    from_secret = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["key"]
        for e in container["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert config.identity.jwt is not None
    assert set(from_secret) == {config.identity.jwt.secret_env, config.admin.token_env}
    assert set(from_secret.values()) <= set(secret)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert container["args"] == ["--config", f"{mounts['config']}/guard.yaml"]
    assert str(config.decision_log).startswith(mounts["logs"] + "/")
    redis = manifests["Service", "floorguard-redis"]
    assert config.store.url == f"redis://{redis['metadata']['name']}:6379/0"


def test_the_dockerfile_runs_the_guard_unprivileged():
    text = (DEPLOY.parent / "Dockerfile").read_text()
    assert re.search(r"^USER 10001$", text, re.M)
    assert 'ENTRYPOINT ["floorguard", "serve"]' in text
    assert 'CMD ["--config", "/etc/floorguard/guard.yaml"]' in text
    assert re.search(r"^EXPOSE 8080 9464$", text, re.M)
    assert "/healthz" in text  # HEALTHCHECK


def test_the_image_builds_the_compiled_core():
    """The build stage copies every file `pip install .` reads — setup.py compiles the core
    (it was left out, and the image ran the pure core) — installs a C compiler first, and
    fails the build unless the core it installed is the compiled one. (No image builder
    runs here; this holds the Dockerfile to what the build needs.)"""
    text = (DEPLOY.parent / "Dockerfile").read_text()
    build = text.split("\nFROM ")[1]  # the first stage
    copied = {name for line in re.findall(r"^COPY (.+) \S+$", build, re.M) for name in line.split()}
    assert {"pyproject.toml", "setup.py", "README.md", "src"} <= copied
    assert build.index("gcc") < build.index("pip install")
    assert "assert r.startswith('compiled')" in build


def test_every_metric_on_the_dashboard_is_one_the_guard_exposes(tmp_path, monkeypatch):
    config, _ = _guard_config(tmp_path, monkeypatch)
    config = config.model_copy(update={"decision_log": None})
    server = GuardServer(config)
    parsed = list(text_string_to_metric_families(generate_latest(server.metrics.registry).decode()))
    families = {f.name for f in parsed}
    dashboard = json.loads((DEPLOY / "grafana" / "floorguard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 16
    used = {
        re.sub(r"_(bucket|total)$", "", name)
        for expr in exprs
        for name in re.findall(r"\b((?:floorguard|process)_[a-z_]+)\b", expr)
    }
    assert used - families == set(), (
        f"the dashboard queries metrics the guard lacks: {used - families}"
    )
    for expr in exprs:  # each replica's job: every selector filters by it (3 of 18 did)
        for selector in re.findall(r"\{([^{}]*)\}", expr):
            assert 'job=~"$job"' in selector, expr
    counters = {f.name for f in parsed if f.type == "counter"}
    for expr in exprs:  # a cumulative count is read as a rate or an increase, never as is
        for name in re.findall(r"\b((?:floorguard|process)_[a-z_]+)\{", expr):
            if re.sub(r"_total$", "", name) in counters:
                assert re.search(rf"(rate|increase)\({name}\{{", expr), expr
    assert {"floorguard_learner_faults", "floorguard_capacity_alarms"} <= counters
    units = {
        panel["title"]: panel["fieldConfig"]["defaults"]["unit"] for panel in dashboard["panels"]
    }
    tokens = next(unit for title, unit in units.items() if title.startswith("Tokens"))
    assert tokens == "suffix: tok/s"  # tokens a second, not requests
    assert {"floorguard_queue_wait_seconds", "floorguard_ttft_seconds"} <= used
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"$" + v for v in variables} >= {
        "$" + v for expr in exprs for v in re.findall(r"\$(\w+)", expr)
    }


def test_the_shipped_secret_placeholders_are_refused(tmp_path, monkeypatch):
    """The example Secret's values pass the length checks (45 and 34 characters), so an
    unedited apply ran with a publicly known HS256 secret and admin token: the guard now
    refuses both, naming the key, never the value."""
    config, manifests = _guard_config(tmp_path, monkeypatch)
    placeholders = manifests["Secret", "floorguard-secrets"]["stringData"]
    real = {"FLOORGUARD_JWT_SECRET": "s" * 32, "FLOORGUARD_ADMIN_TOKEN": "t" * 16}
    for variable, value in (
        ("FLOORGUARD_JWT_SECRET", placeholders["jwt-secret"]),
        ("FLOORGUARD_ADMIN_TOKEN", placeholders["admin-token"]),
    ):
        environ = {**real, variable: value}
        with pytest.raises(ConfigError, match="refused: it is a sample value") as refused:
            create_identity(config.identity, environ)
            admin_token(config, environ)
        assert value not in str(refused.value)
    create_identity(config.identity, real)  # and real ones are taken
    assert admin_token(config, real) == real["FLOORGUARD_ADMIN_TOKEN"]


def _helm() -> str:
    """The helm binary (`FLOORGUARD_HELM`, else on the PATH); skips without one unless
    `FLOORGUARD_REQUIRE_HELM` (.ci/run installs it) makes that a failure."""
    helm = os.environ.get("FLOORGUARD_HELM") or shutil.which("helm")
    if helm is None:
        if os.environ.get("FLOORGUARD_REQUIRE_HELM"):
            pytest.fail("no helm binary and FLOORGUARD_REQUIRE_HELM=1 (.ci/run installs one)")
        pytest.skip("no helm binary: .ci/run installs one (FLOORGUARD_HELM)")
    return helm


def _rendered(*values: str) -> dict[tuple[str, str], dict]:
    args = [arg for value in values for arg in ("--set", value)]
    chart = str(DEPLOY / "helm" / "floorguard")
    out = subprocess.run(
        [_helm(), "template", "floorguard", chart, "-n", "floorguard", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d}


def _comparable(doc: dict) -> dict:
    """A manifest as both forms write it: the env by name, the chart's checksum annotation
    (it rolls the pods on a changed config) left out, the guard config parsed."""
    doc = json.loads(json.dumps(doc))
    if doc["kind"] == "ConfigMap":
        doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
    template = doc.get("spec", {}).get("template")
    if template is not None:
        template["metadata"].get("annotations", {}).pop("checksum/config", None)
        for container in template["spec"]["containers"]:
            container.get("env", []).sort(key=lambda e: e["name"])
    return doc


def test_the_helm_chart_renders_what_the_kustomize_files_apply():
    """By default the chart renders the objects deploy/kubernetes applies (less the
    Namespace, which `helm install --create-namespace` makes, and the Secret, which the
    operator creates): one deployment, two forms, held equal here."""
    rendered = _rendered()
    applied = {
        key: doc
        for key, doc in _manifests().items()
        if key[0] != "Namespace" and key != ("Secret", "floorguard-secrets")
    }
    assert set(rendered) == set(applied)
    for key, doc in applied.items():
        assert _comparable(rendered[key]) == _comparable(doc), key


def test_the_charts_values_render_a_config_the_guard_loads(tmp_path, monkeypatch):
    """Values an operator sets reach the guard's config and the objects that must agree
    with it: the port, the admin port, a floor in first-token terms with reserved slots;
    Redis and the network policies go with their switches."""
    rendered = _rendered(
        "config.port=8081",
        "config.admin.port=9500",
        "config.reserved_slots=2",
        "config.contracts[0].tenant=chat",
        "config.contracts[0].class=assured",
        "config.contracts[0].floor=2",
        "config.contracts[0].ttft_ms=1000",
        "config.contracts[0].tpot_ms=50",
        "config.contracts[1].tenant=batch",
        "config.contracts[1].class=opportunistic",
        "config.contracts[1].deadline_ms=60000",
        "redis.enabled=false",
        "config.store=null",
    )
    path = tmp_path / "guard.yaml"
    path.write_text(rendered["ConfigMap", "floorguard-config"]["data"]["guard.yaml"])
    monkeypatch.setenv("FLOORGUARD_JWT_SECRET", "s" * 32)
    monkeypatch.setenv("FLOORGUARD_ADMIN_TOKEN", "t" * 16)
    config = load_config(path)
    assert (config.port, config.admin.port, config.reserved_slots) == (8081, 9500, 2)
    assert config.contracts[0].ttft_ms == 1000 and config.store is None
    (container,) = rendered["Deployment", "floorguard"]["spec"]["template"]["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8081,
        "admin": 9500,
    }
    assert ("Deployment", "floorguard-redis") not in rendered
    assert ("NetworkPolicy", "floorguard-redis") not in rendered
    policy = rendered["NetworkPolicy", "floorguard"]["spec"]["ingress"]
    assert policy[0]["ports"] == [{"port": 8081, "protocol": "TCP"}]
