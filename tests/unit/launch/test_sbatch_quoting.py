"""Whatever the engine command, labels and env values hold (quotes, $(...), backticks, ';',
globs, unicode), bash runs the rendered script and the node receives exactly those words:
the script is executed for real with a stand-in `llmfabric` that records its argv."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmfabric.launch.profile import parse_profile
from llmfabric.launch.sbatch import render_sbatch
from llmfabric.net.ports import ephemeral_range

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# Words a hostile or careless profile may hold (no NUL: argv cannot carry it).
# (Line breaks are refused by the profile: sbatch rejects \r, argv has no use for \n.)
WORD = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\n"),
               min_size=1, max_size=12)
DUMP = '#!/bin/bash\nprintf "%s\\0" "$@" > "$DUMP_OUT"\nprintf "%s" "$HF_X" > "$DUMP_OUT.env"\n'


def run_script(tmp: pathlib.Path, engine: list[str], label: str, env_value: str) -> list[str]:
    dump = tmp / "llmfabric"
    dump.write_text(DUMP)
    dump.chmod(0o755)
    secret = tmp / "secret"
    secret.write_text("s3cret")
    profile = parse_profile({
        "engine": engine, "env": {"HF_X": env_value},
        "fabric": {"bootstrap": ["h:1"], "secret_file": str(secret), "llmfabric": str(dump),
                   "home": str(tmp / "home-$SLURM_JOB_ID"), "labels": {"k": label}}})
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "SLURM_JOB_ID": "42",
           "DUMP_OUT": str(tmp / "argv")}
    done = subprocess.run(["bash", "-c", render_sbatch(profile)], env=env, cwd=tmp,
                          capture_output=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp / "argv.env").read_bytes().decode() == env_value
    return (tmp / "argv").read_bytes().decode().split("\0")[:-1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine=st.lists(WORD, min_size=1, max_size=4), label=WORD.filter(lambda w: "=" not in w),
       env_value=WORD)
def test_the_node_gets_exactly_the_profiles_words(engine: list[str], label: str,
                                                  env_value: str) -> None:
    if any("{port}" in w for w in engine):
        return  # the placeholder is tested below
    with tempfile.TemporaryDirectory() as d:
        argv = run_script(pathlib.Path(d), engine, label, env_value)
    assert argv[argv.index("--process") + 1:] == engine
    assert f"k={label}" in argv
    assert "slurm_job=42" in argv
    assert argv[argv.index("--home") + 1].endswith("/home-42")


def test_port_placeholder_and_secret(tmp_path: pathlib.Path) -> None:
    argv = run_script(tmp_path, ["serve", "--port", "{port}", "x{port}y"], "v", "e")
    tail = argv[argv.index("--process") + 1:]
    port = tail[2]
    assert port.isdigit() and 0 < int(port) < 65536 and tail[3] == f"x{port}y"
    low, _ = ephemeral_range()
    if low - 10_000 >= 1000:  # picked below the ephemeral range, where no outgoing
        assert 10_000 <= int(port) < low  # connection can take it before the engine binds it
    assert "s3cret" not in " ".join(argv)  # the secret travels in the environment only
