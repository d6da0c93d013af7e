"""Kubernetes manifests for a fabric: `render_k8s(profile)` -> a list of manifests (dicts).

- the ingress (also bootstrap and relay) as a Deployment + a Service (peer port for nodes,
  HTTP port for the OpenAI API and dashboard), its state (accounts DB, admin key) on a PVC
  when `ingress.storage_claim` names one;
- one Deployment per provider: the engine command under `llmfabric start --process`, GPU
  resource requests, node selector and tolerations; the node dials the ingress Service.
Every pod reads the network secret from a Secret (key `network-secret`) into
LLMFABRIC_NETWORK_SECRET, runs with probes on /healthz (a startup probe gives model loads
time), and drains on termination: the preStop hook sends SIGTERM to the node (PID 1), which
announces DOWN, drains, announces LEFT and stops the engine, and waits for it to exit; the
grace period covers drain + engine stop + a margin, so the kubelet's SIGKILL never cuts a
drain short.
"""

from __future__ import annotations

import pathlib
import re
import shlex
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llmfabric.launch.errors import ProfileError, profile_problems

_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?\Z")
PEER_PORT = 7946
HTTP_PORT = 8090
HOME = "/var/lib/llmfabric"
# preStop: SIGTERM the node (PID 1) and wait until it has left; the kubelet's own SIGTERM
# then finds it gone or already stopping (the node handles a second SIGTERM idempotently).
PRE_STOP = "kill -TERM 1; while kill -0 1 2>/dev/null; do sleep 1; done"


def _dns(v: str) -> str:
    if not _DNS.match(v):
        raise ValueError(f"{v!r} is not a DNS label (lowercase letters, digits, '-')")
    return v


class K8sIngress(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    replicas: int = Field(default=1, ge=1, le=1)  # one accounts DB per ingress: scale by nodes
    service_type: str = "LoadBalancer"
    public_addr: str | None = None  # host:port external nodes dial (the LB's address)
    storage_claim: str | None = None  # PVC for the accounts DB and admin key
    cpu: str = "1"
    memory: str = "1Gi"
    args: tuple[str, ...] = ()


class K8sProvider(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    replicas: int = Field(default=1, ge=0)
    image: str | None = None  # default: the profile's image
    gpus: int = Field(default=1, ge=0)
    gpu_resource: str = "nvidia.com/gpu"
    cpu: str = "4"
    memory: str = "16Gi"
    engine: tuple[str, ...] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    startup_s: int = Field(default=900, ge=10)  # model load time the startup probe allows
    args: tuple[str, ...] = ()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _dns(v)

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, v: Any) -> Any:
        return shlex.split(v) if isinstance(v, str) else v


class K8sProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = "llmfabric"
    namespace: str = "default"
    image: str
    secret: str = "llmfabric-network"  # Secret with key `network-secret`
    preset: str = "lan"
    drain_timeout: int = Field(default=20, ge=0)
    engine_stop_timeout: int = Field(default=5, ge=0)
    ingress: K8sIngress = Field(default_factory=K8sIngress)
    providers: tuple[K8sProvider, ...] = ()

    @field_validator("name", "namespace", "secret")
    @classmethod
    def _names(cls, v: str) -> str:
        return _dns(v)

    @property
    def grace_s(self) -> int:
        return self.drain_timeout + self.engine_stop_timeout + 15


def load_k8s_profile(path: pathlib.Path) -> K8sProfile:
    try:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise ProfileError(f"{path} must hold a mapping")
        return K8sProfile(**data)
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path} is not valid YAML: {exc}") from None
    except ValidationError as exc:
        problems = profile_problems(exc, "docs/deploy-k8s.md, Profile")
        raise ProfileError(f"invalid Kubernetes profile {path}: {problems}") from None


def _meta(p: K8sProfile, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": p.namespace,
            "labels": {"app.kubernetes.io/name": p.name,
                       "app.kubernetes.io/component": component}}


def _container(p: K8sProfile, name: str, image: str, args: list[str],
               resources: dict[str, Any], startup_s: int) -> dict[str, Any]:
    probe = {"httpGet": {"path": "/healthz", "port": "http"}}
    return {
        "name": name, "image": image, "command": ["llmfabric"], "args": args,
        "env": [
            {"name": "LLMFABRIC_NETWORK_SECRET",
             "valueFrom": {"secretKeyRef": {"name": p.secret, "key": "network-secret"}}},
            {"name": "LLMFABRIC_HOME", "value": HOME},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        ],
        "ports": [{"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
                  {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": resources,
        "startupProbe": {**probe, "periodSeconds": 10,
                         "failureThreshold": max(1, startup_s // 10)},
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", PRE_STOP]}}},
        "volumeMounts": [{"name": "home", "mountPath": HOME}],
    }


def _deployment(p: K8sProfile, name: str, component: str, replicas: int,
                container: dict[str, Any], *, volume: dict[str, Any],
                pod_extra: dict[str, Any] | None = None) -> dict[str, Any]:
    selector = {"app.kubernetes.io/name": p.name, "app.kubernetes.io/component": component}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": p.grace_s,
        "containers": [container],
        "volumes": [{"name": "home", **volume}],
        **(pod_extra or {}),
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(p, name, component),
        "spec": {"replicas": replicas, "selector": {"matchLabels": selector},
                 "strategy": {"type": "Recreate"} if component == "ingress" else
                 {"type": "RollingUpdate",
                  "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                 "template": {"metadata": {"labels": selector}, "spec": spec}},
    }


def _literal(values: list[str]) -> list[str]:
    """Profile values as the container sees them: Kubernetes expands `$(VAR)` in args (and
    turns `$$` into `$`), so a label `team: $(LLMFABRIC_NETWORK_SECRET)` would have put the
    secret into the node's signed record. Every `$` is doubled; only the renderer's own
    `$(POD_IP)` is expanded."""
    return [v.replace("$", "$$") for v in values]


def _common_args(p: K8sProfile) -> list[str]:
    return ["start", "--listen", f"0.0.0.0:{PEER_PORT}", "--http-listen",
            f"0.0.0.0:{HTTP_PORT}", "--preset", p.preset,
            "--drain-timeout", str(p.drain_timeout),
            "--engine-stop-timeout", str(p.engine_stop_timeout)]


def render_k8s(p: K8sProfile) -> list[dict[str, Any]]:
    ingress_name = f"{p.name}-ingress"
    service_dns = f"{ingress_name}.{p.namespace}.svc.cluster.local:{PEER_PORT}"
    ing = p.ingress
    # Clients inside the cluster name the Service (the dashboard, fleet views and /metrics
    # answer only the names a node knows: front/host_check.py).
    service_names = [f"{ingress_name}{suffix}" for suffix in (
        "", f".{p.namespace}", f".{p.namespace}.svc", f".{p.namespace}.svc.cluster.local")]
    ingress_args = [*_common_args(p), "--ingress", "--relay", "--tier", "stable",
                    *_literal(["--provider", p.name, "--public-addr",
                               ing.public_addr or service_dns,
                               *[x for n in service_names for x in ("--allowed-host", n)],
                               *ing.args])]
    res = {"requests": {"cpu": ing.cpu, "memory": ing.memory},
           "limits": {"memory": ing.memory}}
    volume = ({"persistentVolumeClaim": {"claimName": ing.storage_claim}}
              if ing.storage_claim else {"emptyDir": {}})
    manifests = [
        _deployment(p, ingress_name, "ingress", ing.replicas,
                    _container(p, "ingress", p.image, ingress_args, res, 60), volume=volume),
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(p, ingress_name, "ingress"),
         "spec": {"type": ing.service_type,
                  "selector": {"app.kubernetes.io/name": p.name,
                               "app.kubernetes.io/component": "ingress"},
                  "ports": [{"name": "peer", "port": PEER_PORT, "targetPort": "peer",
                             "protocol": "TCP"},
                            {"name": "http", "port": HTTP_PORT, "targetPort": "http",
                             "protocol": "TCP"}]}},
    ]
    for prov in p.providers:
        labels = [x for k, v in sorted({"site": p.name, **prov.labels}.items())
                  for x in ("--label", f"{k}={v}")]
        args = [*_common_args(p), "--bootstrap", service_dns,
                "--public-addr", f"$(POD_IP):{PEER_PORT}",
                *_literal(["--provider", prov.name, *labels, *prov.args, "--process",
                           *prov.engine])]
        limits: dict[str, Any] = {"memory": prov.memory}
        if prov.gpus:
            limits[prov.gpu_resource] = prov.gpus
        res = {"requests": {"cpu": prov.cpu, "memory": prov.memory}, "limits": limits}
        extra: dict[str, Any] = {}
        if prov.node_selector:
            extra["nodeSelector"] = dict(prov.node_selector)
        if prov.tolerations:
            extra["tolerations"] = [dict(t) for t in prov.tolerations]
        component = f"provider-{prov.name}"
        manifests.append(_deployment(
            p, f"{p.name}-{prov.name}", component, prov.replicas,
            _container(p, "node", prov.image or p.image, args, res, prov.startup_s),
            volume={"emptyDir": {}}, pod_extra=extra))
    return manifests


class _PlainDumper(yaml.SafeDumper):
    """No YAML anchors/aliases: every manifest reads on its own."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_manifests(manifests: list[dict[str, Any]]) -> str:
    return yaml.dump_all(manifests, Dumper=_PlainDumper, sort_keys=False)
