"""The open-file limit is raised at start-up in a process that starts with a low soft limit
(as Slurm jobs often do), never lowered, and capped by the hard limit. Each case runs in a
child process: limits are per process and must not leak into the test run."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

CHILD = """
import resource, sys
from llmfabric.net.fd_limit import raise_open_file_limit
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), hard))
if len(sys.argv) > 3:  # a system that refuses soft limits above a cap (macOS: OPEN_MAX)
    cap, setrlimit = int(sys.argv[3]), resource.setrlimit
    def capped(which, limits):
        if limits[0] > cap:
            raise ValueError("not allowed to raise maximum limit")
        setrlimit(which, limits)
    resource.setrlimit = capped
before, after = raise_open_file_limit(int(sys.argv[2]))
print(before, after, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)
"""


def child(start_soft: int, target: int, cap: int | None = None) -> tuple[int, int, int, int]:
    argv = [sys.executable, "-c", CHILD, str(start_soft), str(target)]
    out = subprocess.run(argv + ([str(cap)] if cap is not None else []),
                         check=True, capture_output=True, text=True).stdout.split()
    a, b, c, d = (int(x) for x in out)
    return a, b, c, d


def test_a_low_soft_limit_is_raised_to_the_target_within_the_hard_limit() -> None:
    before, after, now, hard = child(256, 4096)
    assert before == 256
    assert after == now == (4096 if hard < 0 or hard >= 4096 else hard)


def test_a_higher_soft_limit_is_never_lowered() -> None:
    before, after, now, _ = child(1024, 512)
    assert before == after == now == 1024


def test_a_system_capping_the_soft_limit_gets_its_largest_allowed_value() -> None:
    """macOS refuses a soft limit above OPEN_MAX (10,240) even under an unlimited hard limit:
    asking for 65,536 once failed with a warning and left 256; now it takes 10,240."""
    before, after, now, hard = child(256, 65536, cap=1000)
    assert before == 256
    assert after == now == (min(1000, hard) if hard >= 0 else 1000)
