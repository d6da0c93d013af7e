import pathlib

import pytest

from llmfabric.node.config import ConfigError, build_config, load_config_file, parse_hostport
from llmfabric.node.serve.http_api import ObservedRecord, model_views, node_view, provider_views
from llmfabric.registry.records import (
    Hardware,
    Lifecycle,
    ModelDemand,
    NodeMeta,
    NodeRecord,
    ServedModel,
)


def _rec(sid: str, state: Lifecycle, provider: str, gpu: str, *models: str) -> NodeRecord:
    meta = NodeMeta(
        provider_id=provider,
        hardware=Hardware(gpu_model=gpu, gpu_count=1),
        models=tuple(ServedModel(id=m, aliases=(m.upper(),)) for m in models),
        labels=(("site", "a"),),
    )
    return NodeRecord(sid, "peer-" + sid, b"k", state, 0, 1, 0.0, meta)


def test_model_view_counts_only_routable_nodes_and_skips_left() -> None:
    observed = [
        ObservedRecord(_rec("s1", Lifecycle.SERVING, "p1", "H100", "m"), False, 1.0),
        ObservedRecord(_rec("s2", Lifecycle.SERVING, "p2", "A100", "m"), True, 1.0),
        ObservedRecord(_rec("s3", Lifecycle.DOWN, "p2", "A100", "m"), False, 1.0),
        ObservedRecord(_rec("s4", Lifecycle.LEFT, "p3", "L40", "m", "x"), False, 1.0),
    ]
    [view] = model_views(observed)
    assert view["id"] == "m"
    assert view["serving"] == 1
    assert view["nodes"] == ["s1", "s2", "s3"]
    assert view["providers"] == ["p1", "p2"]
    assert view["gpus"] == ["A100", "H100"]
    assert view["aliases"] == ["M"]
    providers = {p["id"]: p for p in provider_views(observed)}
    assert set(providers) == {"p1", "p2"}
    assert providers["p2"]["nodes"] == 2


def test_a_provider_name_not_backed_by_the_nodes_verified_identity_is_marked() -> None:
    """A name is a node's claim: an impostor claiming "uni-a" with another verified identity
    is listed among the model's unverified providers; the real uni-a is not."""
    observed = [
        ObservedRecord(_rec("s1", Lifecycle.SERVING, "uni-a", "H100", "m"), False, 1.0,
                       "uni-a"),
        ObservedRecord(_rec("s2", Lifecycle.SERVING, "uni-a", "H100", "m"), False, 1.0,
                       "mallory"),
        ObservedRecord(_rec("s3", Lifecycle.SERVING, "uni-b", "H100", "n"), False, 1.0,
                       "uni-b"),
    ]
    views = {v["id"]: v for v in model_views(observed)}
    assert views["m"]["providers"] == ["uni-a"]
    assert views["m"]["unverified_providers"] == ["uni-a"]
    assert views["n"]["unverified_providers"] == []


def test_model_view_sums_the_demand_live_ingresses_observe() -> None:
    def ingress(sid: str, state: Lifecycle, *demand: ModelDemand) -> ObservedRecord:
        meta = NodeMeta(roles=("ingress",), demand=demand)
        return ObservedRecord(NodeRecord(sid, "p" + sid, b"k", state, 0, 1, 0.0, meta), False, 1)

    observed = [
        ObservedRecord(_rec("s1", Lifecycle.SERVING, "p1", "H100", "m", "n"), False, 1.0),
        ingress("i1", Lifecycle.SERVING, ModelDemand("m", 1.5, 10, 5), ModelDemand("N", 0.5, 1, 1)),
        ingress("i2", Lifecycle.JOIN, ModelDemand("m", 0.25, 10, 5),
                ModelDemand("gone-model", 9.0, 1, 1)),  # not in the catalog: not shown
        ingress("i3", Lifecycle.DOWN, ModelDemand("m", 100.0, 10, 5)),  # stale: ignored
    ]
    views = {v["id"]: v for v in model_views(iter(observed))}
    assert set(views) == {"m", "n"}
    assert views["m"]["demand_rps"] == 1.75
    assert views["n"]["demand_rps"] == 0.5  # asked for by its alias


def test_node_view_flattens_record() -> None:
    view = node_view(ObservedRecord(_rec("s1", Lifecycle.SERVING, "p1", "H100", "m"), True, 5.0))
    assert view["state"] == "SERVING"
    assert view["suspected"] is True
    assert view["labels"] == {"site": "a"}
    assert view["models"][0]["role"] == "both"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1.2.3.4:80", ("1.2.3.4", 80)), (":9", ("0.0.0.0", 9)), ("[::1]:7", ("::1", 7))],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


@pytest.mark.parametrize("bad", ["host:port", "1.2.3.4:70000", "x:"])
def test_parse_hostport_rejects_garbage(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_hostport(bad)


def test_flags_override_file_and_errors_name_the_field(tmp_path: pathlib.Path) -> None:
    cfg_file = tmp_path / "node.yaml"
    cfg_file.write_text("listen: 127.0.0.1:1000\nprovider: from-file\npreset: wan\n")
    cfg = build_config(load_config_file(cfg_file), {"provider": "from-flag", "relay": None})
    assert cfg.listen == "127.0.0.1:1000"
    assert cfg.provider == "from-flag"
    assert cfg.preset == "wan"
    with pytest.raises(ConfigError, match="preset"):
        build_config({}, {"preset": "moon"})
    cfg_file.write_text("- not a mapping\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config_file(cfg_file)


def test_bootstrap_entries_may_be_comma_separated() -> None:
    cfg = build_config({"bootstrap": ["a:1,b:2", " c:3 "]}, {})
    assert cfg.bootstrap == ("a:1", "b:2", "c:3")
    with pytest.raises(ConfigError, match="bootstrap"):
        build_config({}, {"bootstrap": ("a:1,nope",)})


def test_config_values_that_mean_nothing_are_refused() -> None:
    """A ready_timeout_s of NaN waited for an engine that never served, forever; other
    fields took NaN, infinities and negative counts and failed later, far from the cause."""
    import math

    import pydantic

    from llmfabric.node.config import NodeConfig

    for field, value in (("ready_timeout_s", math.nan), ("ready_timeout_s", -5.0),
                         ("health_interval_s", 0.0), ("drain_timeout_s", math.inf),
                         ("total_timeout_s", math.inf), ("alloc_end", math.inf),
                         ("max_body_bytes", -1), ("max_retries", -3), ("gpu_count", -8),
                         ("gpu_memory_gb", math.nan)):
        try:
            NodeConfig(**{field: value})
        except pydantic.ValidationError as exc:
            assert field in str(exc)
        else:
            raise AssertionError(f"{field}={value} was accepted")
