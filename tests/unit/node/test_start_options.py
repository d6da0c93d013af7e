"""`llmfabric start` / `llmfabric ingress` options reach NodeConfig; --no-auth is refused off
loopback; aliases attach to served models."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from click.testing import CliRunner

from llmfabric.cli import ingress as ingress_cli
from llmfabric.cli import start as start_cli
from llmfabric.node.config import ConfigError, NodeConfig, build_config
from llmfabric.node.engine_link import with_aliases
from llmfabric.registry.records import ServedModel

from ._start_capture import capture_started


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[NodeConfig]:
    """Capture the config `run_node` would run instead of starting a node."""
    return capture_started(monkeypatch, warn=True)


def _start(args: list[str], tmp_path: pathlib.Path) -> Any:
    return CliRunner().invoke(
        start_cli.command, ["--home", str(tmp_path), "--network-secret", "s" * 16, *args],
        catch_exceptions=False,
    )


def test_no_auth_is_refused_when_the_api_listens_beyond_loopback(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    for extra in (["--http-listen", "0.0.0.0:8090"],
                  ["--http-listen", "10.1.2.3:8090"],
                  ["--api-listen", "0.0.0.0:8091"]):
        res = _start(["--ingress", "--no-auth", *extra], tmp_path)
        assert res.exit_code != 0, extra
        assert "only for a local demo" in res.output and "not a loopback" in res.output
    assert started == []
    # The same through a config file (no flag to forget): auth: false + a public address.
    cfg = tmp_path / "node.yaml"
    cfg.write_text("ingress: true\nauth: false\nhttp_listen: 0.0.0.0:8090\n")
    assert _start(["--config", str(cfg)], tmp_path).exit_code != 0
    with pytest.raises(ConfigError, match="not a loopback"):
        build_config({}, {"ingress": True, "auth": False, "http_listen": "[::]:8090"})
    # Auth on: any address is fine; a provider-only node has no API to protect.
    assert build_config({}, {"ingress": True, "http_listen": "0.0.0.0:8090"}).auth
    assert not build_config({}, {"auth": False, "http_listen": "0.0.0.0:8090"}).auth


def test_no_auth_on_loopback_starts_with_a_loud_warning(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = _start(["--ingress", "--no-auth", "--http-listen", "127.0.0.1:0"], tmp_path)
    assert res.exit_code == 0, res.output
    assert started[-1].auth is False
    assert "WARNING: API keys are OFF" in res.output


def test_standalone_ingress_refuses_no_auth_off_loopback() -> None:
    res = CliRunner().invoke(ingress_cli.command, [
        "--host", "0.0.0.0", "--no-auth", "--backend", "m=127.0.0.1:9"])
    assert res.exit_code == 2 and "not a loopback" in res.output


def test_start_exposes_health_timeouts_and_aliases(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = _start([
        "--ingress", "--health-failures", "5", "--health-interval", "0.5",
        "--ready-timeout", "60", "--drain-timeout", "10", "--engine-stop-timeout", "3",
        "--connect-timeout", "1.5", "--first-byte-timeout", "20", "--idle-timeout", "7",
        "--total-timeout", "90", "--alias", "llama=llama-3.1-8b", "--alias", "q=qwen3-1.7b",
    ], tmp_path)
    assert res.exit_code == 0, res.output
    c = started[-1]
    assert (c.health_failures, c.health_interval_s, c.ready_timeout_s) == (5, 0.5, 60)
    assert (c.drain_timeout_s, c.engine_stop_timeout_s) == (10, 3)
    assert (c.connect_timeout_s, c.first_byte_timeout_s, c.idle_timeout_s,
            c.total_timeout_s) == (1.5, 20, 7, 90)
    assert c.aliases == {"llama": "llama-3.1-8b", "q": "qwen3-1.7b"}
    for bad in (["--alias", "nomodel"], ["--alias", "=m"], ["--health-failures", "0"],
                ["--connect-timeout", "0"]):
        assert _start(bad, tmp_path).exit_code == 2, bad


def test_model_alias_pins_reach_the_ingress_config(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = _start(["--ingress", "--model-alias", "llama=meta-llama/Llama-3.1-8B"], tmp_path)
    assert res.exit_code == 0, res.output
    assert started[-1].model_aliases == {"llama": "meta-llama/Llama-3.1-8B"}
    assert _start(["--model-alias", "llama"], tmp_path).exit_code == 2
    res = CliRunner().invoke(ingress_cli.command, ["--network-secret", "s" * 16,
                                                   "--model-alias", "q=qwen3-1.7b"])
    assert res.exit_code == 0, res.output
    assert started[-1].model_aliases == {"q": "qwen3-1.7b"}


def test_unset_flags_leave_config_file_values(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    cfg = tmp_path / "node.yaml"
    cfg.write_text("idle_timeout_s: 9\nhealth_failures: 4\naliases: {l: llama-3.1-8b}\n")
    assert _start(["--config", str(cfg), "--connect-timeout", "2"], tmp_path).exit_code == 0
    c = started[-1]
    assert (c.idle_timeout_s, c.connect_timeout_s, c.health_failures) == (9, 2, 4)
    assert c.total_timeout_s == NodeConfig.model_fields["total_timeout_s"].default
    assert c.aliases == {"l": "llama-3.1-8b"}


def test_fabric_mode_ingress_passes_its_timeouts(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = CliRunner().invoke(ingress_cli.command, [
        "--network-secret", "s" * 16, "--port", "18090", "--no-auth", "--idle-timeout", "4",
        "--first-byte-timeout", "30"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert (started[-1].idle_timeout_s, started[-1].first_byte_timeout_s) == (4, 30)


def test_default_sigterm_budget_fits_slurm_kill_wait() -> None:
    c = NodeConfig()
    assert c.drain_timeout_s + c.engine_stop_timeout_s < start_cli.SLURM_KILL_WAIT_S - 2


def test_slow_stop_settings_are_warned_about(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = _start(["--drain-timeout", "30", "--process", "true", "--port", "9"], tmp_path)
    assert res.exit_code == 0 and "KillWait" in res.output


def test_aliases_attach_to_the_models_they_name(caplog: pytest.LogCaptureFixture) -> None:
    models = (ServedModel("a", aliases=("x",)), ServedModel("b"))
    got = with_aliases(models, {"y": "a", "x": "a", "bee": "b", "nope": "c", "b": "a"})
    assert [(m.id, m.aliases) for m in got] == [("a", ("x", "y")), ("b", ("bee",))]
    assert "serves no model 'c'" in caplog.text and "already a served model id" in caplog.text


def test_bad_engine_flags_are_one_clear_line(tmp_path: pathlib.Path) -> None:
    for args, needle in (
        (["--network-secret", "short"], "at least 16 bytes"),
        (["--network-secret", "s" * 16, "--engine", "bogus", "--process", "x"],
         "unknown engine kind 'bogus'"),
    ):
        res = CliRunner().invoke(start_cli.command, ["--home", str(tmp_path), *args])
        assert res.exit_code != 0
        assert needle in res.output and "Traceback" not in res.output


def test_an_engine_command_without_a_port_is_refused_before_the_node_starts(
        started: list[NodeConfig], tmp_path: pathlib.Path) -> None:
    """A command of no known engine without --port raised EngineCommandError as a traceback,
    after the node had bound its listeners and joined."""
    for args, needle in (
        (["--process", "my-server", "serve", "m"],
         "cannot tell which port the engine listens on: an OpenAI-compatible engine (no "
         "known engine named in `my-server serve m`; --engine KIND sets one) has no default "
         "port; add --port to its command or pass --engine-url http://HOST:PORT"),
        (["--process", "llmfabric", "engine", "sim"],
         "cannot tell which port the engine listens on: the sim engine (detected from "
         "`llmfabric engine sim`) has no default port; add --port to its command or pass "
         "--engine-url http://HOST:PORT"),
        (["--process", "docker", "run", "--rm", "img", "llmfabric", "engine", "sim"],
         "cannot tell which port the engine listens on: the sim engine (detected from "
         "`llmfabric engine sim`) has no default port; add --port to its command or pass "
         "--engine-url http://HOST:PORT"),
        (["--process", "vllm", "serve", "m", "--port", "x"], "engine --port 'x' is not a number"),
    ):
        res = CliRunner().invoke(start_cli.command, ["--home", str(tmp_path), "--network-secret",
                                                     "s" * 16, *args])
        assert res.exit_code == 1 and res.output == f"Error: {needle}\n", res.output
    assert started == []
    assert _start(["--process", "my-server", "--port", "9000"], tmp_path).exit_code == 0
    assert started[0].process == ("my-server", "--port", "9000")


def test_engine_policy_flags_reach_the_config(
    tmp_path: pathlib.Path, started: list[NodeConfig]
) -> None:
    res = _start(["--engine", "llamacpp", "--model-id", "a", "--model-id", "b",
                  "--on-engine-exit", "leave", "--engine-restarts", "0", "--process", "srv",
                  "--port", "1"], tmp_path)
    assert res.exit_code == 0, res.output
    c = started[-1]
    assert (c.engine_kind, c.model_ids, c.on_engine_exit, c.engine_restarts) == (
        "llama.cpp", ("a", "b"), "leave", 0)
    assert NodeConfig().on_engine_exit == "restart" and NodeConfig().engine_restarts == 3


def test_fabric_mode_ingress_passes_front_limits_and_the_db_variable(
    tmp_path: pathlib.Path, started: list[NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`llmfabric ingress --network-secret S` dropped --front-limit without a word, and kept
    its accounts in <home>/accounts.db whatever $LLMFABRIC_DB said (its --help promised it)."""
    monkeypatch.setenv("LLMFABRIC_DB", str(tmp_path / "shared.db"))
    res = CliRunner().invoke(ingress_cli.command, [
        "--network-secret", "s" * 16, "--front-limit", "header_timeout_s=7"],
        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert started[-1].front_limits == {"header_timeout_s": 7}
    assert started[-1].db == str(tmp_path / "shared.db")


@pytest.mark.parametrize("flag", [["--workers", "2"], ["--forward-prefix", "/x"]])
def test_fabric_mode_ingress_refuses_backend_only_flags(
    started: list[NodeConfig], flag: list[str]
) -> None:
    """--workers and --forward-prefix apply to --backend ingresses; a fabric ingress ignored
    them silently (one process, no prefix), now it says so."""
    res = CliRunner().invoke(ingress_cli.command, ["--network-secret", "s" * 16, *flag])
    assert res.exit_code == 2 and "applies to --backend ingresses" in res.output
    assert not started


@pytest.mark.parametrize("flag", [["--bootstrap", "peer:7946"], ["--network-secret", "s" * 16],
                                  ["--listen", "0.0.0.0:7000"]])
def test_a_backend_ingress_refuses_fabric_flags_given_on_its_command_line(
    started: list[NodeConfig], flag: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ingress --backend m=h:1 --bootstrap peer:7946` ran standalone and ignored the
    bootstrap without a word: it looked like a join. Set in the environment (for other
    commands) they stay ignored."""
    ran: list[object] = []
    monkeypatch.setattr(ingress_cli, "_run", lambda *a, **k: ran.append(a))
    res = CliRunner().invoke(ingress_cli.command, ["--backend", "m=127.0.0.1:1", *flag])
    assert res.exit_code == 2, res.output
    said = " ".join(res.output.split())
    assert (f"{flag[0]} is for a fabric ingress, which routes over the fabric's nodes: drop "
            f"--backend to run one, or drop {flag[0]} for a standalone ingress") in said
    assert not started and not ran
    res = CliRunner().invoke(ingress_cli.command, ["--backend", "m=127.0.0.1:1"], env={
        "LLMFABRIC_BOOTSTRAP": "peer:7946", "LLMFABRIC_NETWORK_SECRET": "s" * 16})
    assert res.exit_code == 0, res.output
    assert len(ran) == 1 and not started


def test_an_unknown_policy_is_one_clear_line(tmp_path: pathlib.Path) -> None:
    """`start --ingress --policy bogus` (or `policy: bogus` in the config file) ended in
    UnknownPolicyError's traceback once the node built its ingress."""
    res = CliRunner().invoke(start_cli.command, [
        "--home", str(tmp_path), "--network-secret", "s" * 16, "--ingress", "--policy", "bogus"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "policy: unknown routing policy 'bogus'; choose one of:" in res.output
    assert "least_outstanding" in res.output
    assert build_config({}, {"policy": "cache_aware"}).policy == "cache_aware"


def test_batch_retention_reaches_both_composition_roots(
    tmp_path: pathlib.Path, started: list[NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    res = _start(["--ingress", "--batch-dir", str(tmp_path / "b"), "--batch-retention", "30d"],
                 tmp_path)
    assert res.exit_code == 0, res.output
    assert started[-1].batch_retention_s == 30 * 86_400
    assert _start(["--ingress"], tmp_path).exit_code == 0
    assert started[-1].batch_retention_s is None  # (default: kept until deleted)
    res = _start(["--batch-retention", "forever"], tmp_path)
    assert res.exit_code == 2 and "duration" in res.output
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"batch_dir: {tmp_path / 'b'}\nbatch_retention_s: 12h\n")  # (a duration too)
    assert _start(["--config", str(cfg)], tmp_path).exit_code == 0
    assert started[-1].batch_retention_s == 12 * 3600
    with pytest.raises(ConfigError, match="duration"):
        build_config({}, {"batch_retention_s": "soon"})
    res = CliRunner().invoke(ingress_cli.command, [  # (a fabric ingress node)
        "--network-secret", "s" * 16, "--batch-dir", str(tmp_path / "b"),
        "--batch-retention", "2w"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert started[-1].batch_retention_s == 14 * 86_400
    ran: list[ingress_cli.Settings] = []  # (a standalone ingress)
    monkeypatch.setattr(ingress_cli, "_run", lambda settings, **kw: ran.append(settings))
    res = CliRunner().invoke(ingress_cli.command, [
        "--backend", "m=127.0.0.1:9", "--batch-dir", str(tmp_path / "b"),
        "--batch-retention", "90m"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert ran[-1].batch_retention_s == 90 * 60


def test_batch_limits_reach_both_composition_roots(
    tmp_path: pathlib.Path, started: list[NodeConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the input file's size was an option (`llmfabric ingress --batch-max-file-mb`; not
    even that on `start`): every other Batch API cap was fixed, per owner."""
    from llmfabric.batch.limits import BatchLimits, limits_of

    mib = 1024 * 1024
    caps = ["--batch-limit", "max_bytes_per_owner=200MiB", "--batch-limit",
            "max_active_batches_per_owner=2", "--batch-limit", "max_file_bytes=10MB"]
    res = _start(["--ingress", "--batch-dir", str(tmp_path / "b"), *caps], tmp_path)
    assert res.exit_code == 0, res.output
    assert started[-1].batch_limits == {"max_bytes_per_owner": 200 * mib,
                                        "max_active_batches_per_owner": 2,
                                        "max_file_bytes": 10 ** 7}
    assert limits_of(started[-1]) == BatchLimits(
        max_bytes_per_owner=200 * mib, max_active_batches_per_owner=2, max_file_bytes=10 ** 7,
        max_line_bytes=started[-1].max_body_bytes)
    cfg = tmp_path / "node.yaml"  # (the config file: batch_limits, sizes too)
    cfg.write_text(f"batch_dir: {tmp_path / 'b'}\nbatch_limits:\n  max_output_bytes: 5GiB\n")
    assert _start(["--config", str(cfg), "--batch-limit", "max_lines=9"], tmp_path
                  ).exit_code == 0
    assert started[-1].batch_limits == {"max_lines": 9}  # (a flag replaces the file's map)
    assert _start(["--config", str(cfg)], tmp_path).exit_code == 0
    assert limits_of(started[-1]).max_output_bytes == 5 * 1024 * mib
    res = CliRunner().invoke(ingress_cli.command, [  # (a fabric ingress node)
        "--network-secret", "s" * 16, "--batch-dir", str(tmp_path / "b"), *caps],
        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert started[-1].batch_limits["max_bytes_per_owner"] == 200 * mib
    assert started[-1].batch_concurrency == 4 and started[-1].batch_max_file_bytes is None
    res = CliRunner().invoke(ingress_cli.command, [
        "--network-secret", "s" * 16, "--batch-dir", str(tmp_path / "b"),
        "--batch-max-file-mb", "3", "--batch-concurrency", "6"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert limits_of(started[-1]).max_file_bytes == 3 * mib
    assert started[-1].batch_concurrency == 6
    ran: list[ingress_cli.Settings] = []  # (a standalone ingress)
    monkeypatch.setattr(ingress_cli, "_run", lambda settings, **kw: ran.append(settings))
    res = CliRunner().invoke(ingress_cli.command, [
        "--backend", "m=127.0.0.1:9", "--batch-dir", str(tmp_path / "b"), *caps,
        "--batch-concurrency", "3", "--max-body-mb", "2"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert limits_of(ran[-1]) == BatchLimits(
        max_bytes_per_owner=200 * mib, max_active_batches_per_owner=2, max_file_bytes=10 ** 7,
        max_line_bytes=2 * mib, concurrency=3)
    res = CliRunner().invoke(ingress_cli.command, [  # (--batch-max-file-mb still works)
        "--backend", "m=127.0.0.1:9", "--batch-dir", str(tmp_path / "b"),
        "--batch-max-file-mb", "0.5"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert limits_of(ran[-1]).max_file_bytes == mib // 2


@pytest.mark.parametrize("mode", [["--backend", "m=127.0.0.1:9"],
                                  ["--network-secret", "s" * 16], "start"])
@pytest.mark.parametrize("limit,said", [
    ("nope=3", "unknown batch limit 'nope' (known: max_file_bytes, max_lines, "
               "max_files_per_owner, max_bytes_per_owner, max_active_batches_per_owner, "
               "max_output_bytes, max_output_files_per_owner)"),
    ("max_lines=0", "batch limit max_lines='0' must be at least 1"),
    ("max_lines=-5", "batch limit max_lines='-5' is not a whole number above 0"),
    ("max_lines=2.5", "batch limit max_lines='2.5' is not a whole number above 0"),
    ("max_lines=nan", "batch limit max_lines='nan' is not a whole number above 0"),
    ("max_bytes_per_owner=lots", "batch limit max_bytes_per_owner='lots' is not a whole "
                                 "number of bytes above 0"),
    ("concurrency=9", "batch limit 'concurrency' is not a key: --batch-concurrency sets it"),
    ("max_lines", "'max_lines' is not key=value"),
])
def test_a_bad_batch_limit_is_one_line_naming_the_flag(
    tmp_path: pathlib.Path, started: list[NodeConfig], monkeypatch: pytest.MonkeyPatch,
    mode: list[str] | str, limit: str, said: str,
) -> None:
    ran: list[object] = []
    monkeypatch.setattr(ingress_cli, "_run", lambda *a, **k: ran.append(a))
    args = ["--batch-dir", str(tmp_path / "b"), "--batch-limit", limit]
    res = (_start(["--ingress", *args], tmp_path) if mode == "start"
           else CliRunner().invoke(ingress_cli.command, [*mode, *args]))
    assert res.exit_code == 2, res.output
    errors = [line for line in res.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, res.output
    assert errors[0].startswith(f"Error: Invalid value for '--batch-limit': {said}"), errors
    assert not started and not ran


@pytest.mark.parametrize("mode", [["--backend", "m=127.0.0.1:9"],
                                  ["--network-secret", "s" * 16], "start"])
def test_batch_flags_without_batch_dir_are_refused(
    tmp_path: pathlib.Path, started: list[NodeConfig], monkeypatch: pytest.MonkeyPatch,
    mode: list[str] | str,
) -> None:
    """--batch-concurrency (and --batch-max-file-mb, --batch-retention) without --batch-dir
    were ignored without a word; --batch-limit is refused there, and so are they."""
    ran: list[object] = []
    monkeypatch.setattr(ingress_cli, "_run", lambda *a, **k: ran.append(a))

    def invoke(*args: str) -> Any:
        if mode == "start":
            return _start(["--ingress", *args], tmp_path)
        return CliRunner().invoke(ingress_cli.command, [*mode, *args])

    res = invoke("--batch-limit", "max_lines=5")
    assert res.exit_code != 0 and "--batch-limit goes with --batch-dir" in res.output
    res = invoke("--batch-concurrency", "8", "--batch-retention", "30d")
    assert res.exit_code != 0, res.output
    assert "--batch-concurrency, --batch-retention go with --batch-dir" in res.output
    if mode != "start":  # (`start` has no --batch-max-file-mb: --batch-limit max_file_bytes)
        res = invoke("--batch-max-file-mb", "5")
        assert res.exit_code == 2 and "--batch-max-file-mb goes with --batch-dir" in res.output
        res = invoke("--batch-dir", str(tmp_path / "b"), "--batch-max-file-mb", "5",
                     "--batch-limit", "max_file_bytes=5MiB")
        assert res.exit_code == 2 and ("--batch-max-file-mb and --batch-limit max_file_bytes "
                                       "set the same cap: give one") in res.output
    assert not started and not ran
    assert invoke().exit_code == 0  # (no batch flag: fine, the Batch API is off)
