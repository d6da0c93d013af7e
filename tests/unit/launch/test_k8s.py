"""`llmfabric k8s render`: every manifest validates (strict) against a current Kubernetes
schema (kubernetes-validate), and the fabric's needs are in them: GPU requests, the secret
from a Secret, probes, a preStop drain and a grace period that covers it."""

from __future__ import annotations

import pathlib
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from llmfabric.cli.main import cli
from llmfabric.launch.errors import ProfileError
from llmfabric.launch.k8s import K8sProfile, load_k8s_profile, render_k8s

EXAMPLE = pathlib.Path(__file__).resolve().parents[3] / "examples" / "k8s.yaml"
K8S_VERSION = kubernetes_validate.utils.latest_version()


def profile(**over: Any) -> K8sProfile:
    data: dict[str, Any] = {
        "name": "fab", "namespace": "llm", "image": "example/llmfabric:1",
        "providers": [{"name": "llama", "replicas": 2, "gpus": 4,
                       "engine": "vllm serve m --port 8000", "node_selector": {"gpu": "a100"},
                       "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                        "effect": "NoSchedule"}]}],
    }
    data.update(over)
    return K8sProfile(**data)


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = manifest["spec"]["template"]["spec"]["containers"][0]
    return c


def test_every_manifest_validates_strictly_against_the_kubernetes_schema() -> None:
    manifests = render_k8s(load_k8s_profile(EXAMPLE)) + render_k8s(profile())
    for m in manifests:
        kubernetes_validate.validate(m, K8S_VERSION, strict=True)  # raises when invalid
    assert [m["kind"] for m in render_k8s(profile())] == ["Deployment", "Service", "Deployment"]


def test_a_broken_manifest_is_caught_by_the_validator() -> None:
    bad = render_k8s(profile())[2]
    container(bad)["resources"]["limits"]["nvidia.com/gpu"] = {"many": True}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_provider_pods_have_what_the_fabric_needs() -> None:
    p = profile()
    dep = render_k8s(p)[2]
    c, pod = container(dep), dep["spec"]["template"]["spec"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    env = {e["name"]: e for e in c["env"]}
    assert env["LLMFABRIC_NETWORK_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": "llmfabric-network", "key": "network-secret"}
    assert all(k in c for k in ("startupProbe", "readinessProbe", "livenessProbe"))
    assert "kill -TERM 1" in c["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert pod["terminationGracePeriodSeconds"] > p.drain_timeout + p.engine_stop_timeout
    assert pod["nodeSelector"] == {"gpu": "a100"} and pod["tolerations"]
    args = c["args"]
    assert args[args.index("--bootstrap") + 1] == "fab-ingress.llm.svc.cluster.local:7946"
    assert args[args.index("--process") + 1:] == ["vllm", "serve", "m", "--port", "8000"]
    svc = render_k8s(p)[1]
    assert {port["port"] for port in svc["spec"]["ports"]} == {7946, 8090}


def test_bad_profiles_name_the_field(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "Bad_Name", "image": "x"}))
    with pytest.raises(ProfileError, match="name"):
        load_k8s_profile(path)
    path.write_text(yaml.safe_dump({"image": "x", "providers": [{"name": "a"}]}))
    with pytest.raises(ProfileError, match="engine"):
        load_k8s_profile(path)
    # a misspelt key is named as unknown, with where the keys are (was pydantic's words)
    path.write_text(yaml.safe_dump({"image": "x", "namespce": "llm"}))
    with pytest.raises(ProfileError, match=r"namespce: unknown key \(the keys: docs/deploy-k8s"):
        load_k8s_profile(path)


def test_the_cli_prints_applyable_yaml() -> None:
    done = CliRunner().invoke(cli, ["k8s", "render", str(EXAMPLE)])
    assert done.exit_code == 0, done.output
    docs = list(yaml.safe_load_all(done.stdout))
    assert len(docs) == 3 and "&id" not in done.stdout
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@pytest.mark.hostile
def test_profile_values_reach_the_container_literally() -> None:
    """Kubernetes expands $(VAR) in args and turns $$ into $: a label
    `team: $(LLMFABRIC_NETWORK_SECRET)` would have published the secret in the node's signed
    record. Profile values are escaped; only the renderer's $(POD_IP) is expanded."""
    p = profile(providers=[{"name": "llama", "engine": "vllm serve m --served-model-name cost$1",
                            "labels": {"team": "$(LLMFABRIC_NETWORK_SECRET)"},
                            "args": ["--tier", "$(HOME)"]}])
    args = container(render_k8s(p)[2])["args"]
    assert "team=$$(LLMFABRIC_NETWORK_SECRET)" in args and "$$(HOME)" in args
    assert "cost$$1" in args
    assert [a for a in args if "POD_IP" in a] == ["$(POD_IP):7946"]


def test_the_ingress_answers_the_service_names_clients_in_the_cluster_use() -> None:
    # The dashboard, fleet views and /metrics answer only Host names the node knows (DNS
    # rebinding: front/host_check.py); in-cluster clients name the Service.
    from llmfabric.cli.start import config_from_options
    from llmfabric.front.host_check import HostGuard, names_of

    args = container(render_k8s(profile(ingress={"public_addr": "lb.example.org:7946"}))[0])[
        "args"]
    allowed = [args[i + 1] for i, a in enumerate(args) if a == "--allowed-host"]
    config = config_from_options({"allowed_hosts": tuple(allowed)})
    guard = HostGuard([*config.allowed_hosts, *names_of(["lb.example.org:7946"])])
    for name in ("fab-ingress", "fab-ingress.llm", "fab-ingress.llm.svc",
                 "fab-ingress.llm.svc.cluster.local", "lb.example.org"):
        assert guard.host_ok(f"{name}:8090"), name
    assert not guard.host_ok("fab-ingress.evil.example:8090")
