import pytest

from llmfabric.node.engine_link import EngineBindError, loopback_engine_command

pytestmark = pytest.mark.unit


def test_vllm_without_host_is_bound_to_loopback() -> None:
    argv = ("vllm", "serve", "m", "--port", "8000")
    assert loopback_engine_command(argv) == (*argv, "--host", "127.0.0.1")
    # allowed to bind publicly: the operator's command is left as it is
    assert loopback_engine_command(argv, allow_public=True) == argv


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "127.0.0.9"])
def test_loopback_hosts_pass(host: str) -> None:
    argv = ("python", "-m", "sglang.launch_server", "--host", host, "--port", "3000")
    assert loopback_engine_command(argv) == argv
    assert loopback_engine_command(("llama-server", f"--host={host}")) == (
        "llama-server", f"--host={host}")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "example.org"])
def test_public_binds_are_refused_unless_allowed(host: str) -> None:
    argv = ("vllm", "serve", "m", "--host", host)
    with pytest.raises(EngineBindError, match="--allow-engine-public-bind"):
        loopback_engine_command(argv)
    with pytest.raises(EngineBindError):
        loopback_engine_command(("llama-server", f"--host={host}"))
    assert loopback_engine_command(argv, allow_public=True) == argv


def test_engines_that_default_to_loopback_are_untouched() -> None:
    for argv in (("llama-server", "-m", "x.gguf"),
                 ("python", "-m", "sglang.launch_server", "--model-path", "m")):
        assert loopback_engine_command(argv) == argv
