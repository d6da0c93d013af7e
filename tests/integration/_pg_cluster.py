"""A throwaway PostgreSQL cluster for tests: initdb into a temp dir, pg_ctl start on a free
loopback port (and a unix socket in the same dir), trust auth, fsync off; stopped with
`pg_ctl stop -m immediate` and removed at exit, even when a test failed.

Postgres refuses to run as root, so as root the cluster belongs to the `postgres` system user
and every server command runs through `runuser -u postgres --`. Every wait is bounded.
`LLMFABRIC_TEST_POSTGRES_URL` (a superuser URL of a server you run) skips all of this.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pathlib
import pwd
import shutil
import signal
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass

from llmfabric.net.ports import free_port

ENV_URL = "LLMFABRIC_TEST_POSTGRES_URL"
_START_TIMEOUT_S = 30
_SUBPROCESS_SLACK_S = 30
_counter = itertools.count()


class PostgresUnavailable(Exception):
    """No way to run a server here; the message is the skip reason."""


@dataclass(frozen=True, slots=True)
class PgServer:
    """A running server; `url` connects as superuser to the `postgres` database."""

    url: str

    def new_database(self) -> str:
        """Create an empty database and return its URL (each test gets its own)."""
        import psycopg

        name = f"t{os.getpid()}_{next(_counter)}"
        with psycopg.connect(self.url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        parts = urllib.parse.urlsplit(self.url)
        return urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))


def find_bin_dir() -> pathlib.Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb and pg_ctl, else the one on PATH."""
    def version(path: str) -> float:
        try:
            return float(pathlib.Path(path).parent.name)
        except ValueError:
            return 0.0

    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        d = pathlib.Path(cand)
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file():
            return d
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if initdb and pg_ctl and pathlib.Path(initdb).parent == pathlib.Path(pg_ctl).parent:
        return pathlib.Path(initdb).parent
    return None


def _runner() -> list[str]:
    """The command prefix that runs a server command as a user Postgres accepts."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root and no `postgres` system user to run the server as "
            "(apt-get install postgresql creates it)"
        ) from None
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", "postgres", "--"]
    raise PostgresUnavailable("running as root and `runuser` is missing (util-linux)")


def _run(cmd: list[str], cwd: pathlib.Path, timeout: float) -> None:
    out = subprocess.run(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")


@contextlib.contextmanager
def postgres_server() -> Iterator[PgServer]:
    """Start a throwaway cluster (or use $LLMFABRIC_TEST_POSTGRES_URL); raises
    PostgresUnavailable (a skip reason) when psycopg or the server binaries are missing."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PostgresUnavailable(
            "psycopg is not installed: pip install -e '.[dev]' (or '.[postgres]')"
        ) from None
    external = os.environ.get(ENV_URL)
    if external:
        yield PgServer(external)
        return
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise PostgresUnavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin or "
            f"on PATH: apt-get install postgresql, or set {ENV_URL}"
        )
    prefix = _runner()
    base = pathlib.Path(tempfile.mkdtemp(prefix="llmfabric-pg-"))
    data = base / "data"
    started = False
    try:
        if prefix:  # the cluster belongs to the postgres user
            pw = pwd.getpwnam("postgres")
            os.chown(base, pw.pw_uid, pw.pw_gid)
        _run([*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
              "-E", "UTF8", "--locale=C", "--no-sync"], base, 60 + _SUBPROCESS_SLACK_S)
        for attempt in range(3):  # a free port may be taken before the server binds it
            port = free_port()
            opts = (f"-c listen_addresses=127.0.0.1 -p {port} -k {base} -c fsync=off "
                    "-c synchronous_commit=off -c full_page_writes=off -c max_connections=100")
            try:
                started = True  # from here on, stop it at exit even if start half-worked
                _run([*prefix, str(bin_dir / "pg_ctl"), "start", "-D", str(data), "-w",
                      "-t", str(_START_TIMEOUT_S), "-l", str(base / "server.log"), "-o", opts],
                     base, _START_TIMEOUT_S + _SUBPROCESS_SLACK_S)
                break
            except RuntimeError:
                _stop(prefix, bin_dir, base, data)
                started = False
                if attempt == 2:
                    log = base / "server.log"
                    raise RuntimeError(
                        "postgres did not start; server log:\n"
                        + (log.read_text() if log.exists() else "(none)")
                    ) from None
        yield PgServer(f"postgresql://postgres@127.0.0.1:{port}/postgres")
    finally:
        if started:
            _stop(prefix, bin_dir, base, data)
        shutil.rmtree(base, ignore_errors=True)


def _stop(prefix: list[str], bin_dir: pathlib.Path, base: pathlib.Path,
          data: pathlib.Path) -> None:
    """pg_ctl stop -m immediate; if that fails, SIGKILL the postmaster we started."""
    try:
        _run([*prefix, str(bin_dir / "pg_ctl"), "stop", "-D", str(data), "-m", "immediate",
              "-w", "-t", "20"], base, 20 + _SUBPROCESS_SLACK_S)
        return
    except (RuntimeError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(FileNotFoundError, ValueError, IndexError, ProcessLookupError):
        pid = int((data / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGKILL)
