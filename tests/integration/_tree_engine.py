"""An engine that forks like vLLM does: one child in its process group and one that left it
with setsid(); writes "MAIN CHILD ESCAPED" pids to argv[1], then becomes the sim engine."""

from __future__ import annotations

import os
import subprocess
import sys

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
child = subprocess.Popen(SLEEP)
escaped = subprocess.Popen(SLEEP, start_new_session=True)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()} {child.pid} {escaped.pid}")
os.execv(sys.executable, [sys.executable, "-m", "llmfabric.cli.engine", "sim", *sys.argv[2:]])
