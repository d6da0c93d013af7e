"""Which node key a Slurm job's node runs under, read from the job's home.

The sbatch script gives each job a home (the profile's `fabric.home`, by default
`$HOME/.llmfabric/slurm/$SLURM_JOB_ID`) where its node creates its key on first start
(identity/keys.py, `node.key`). The launcher submits the jobs, so it runs as their user and,
on a cluster's shared file system, can read that key: it then knows the one peer whose
`slurm_job` claim is the job's own. Job ids are public and labels are claims; on networks
where no certificate names a provider (PSK) this is what keeps another member from pinning
an idle job of ours by claiming it busy. Where the key cannot be read (no shared file system,
the node not started yet), the caller falls back to the claims.
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping

from llmfabric.identity.errors import KeyFileError
from llmfabric.identity.keys import NODE_KEY_FILE, NodeKey
from llmfabric.untrusted import get_logger

log = get_logger("llmfabric.launch")

_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def job_home(template: str, job_id: str, env: Mapping[str, str]) -> pathlib.Path | None:
    """The home `template` names for `job_id`, expanded as the sbatch script's shell would
    (`~`, $VAR and ${VAR} from `env`, SLURM_JOB_ID = the job); None if a variable is unset."""
    values = {**env, "SLURM_JOB_ID": job_id}
    if template == "~" or template.startswith("~/"):
        template = "$HOME" + template[1:]
    missing: list[str] = []

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            missing.append(name)
            return ""
        return values[name]

    path = _VAR.sub(value, template)
    return None if missing or not path else pathlib.Path(path)


class JobKeys:
    """Job id -> the peer id of the key in its home; a key once read is remembered (a job's
    home keeps one key for the job's life)."""

    def __init__(self, home_template: str, env: Mapping[str, str] | None = None) -> None:
        self.template = home_template
        self._env = dict(os.environ if env is None else env)
        self._peers: dict[str, str] = {}
        self._unread: set[str] = set()  # jobs whose key could not be read (logged once)

    def peer(self, job_id: str) -> str | None:
        """The job's node's peer id, or None while its key cannot be read."""
        known = self._peers.get(job_id)
        if known is not None:
            return known
        home = job_home(self.template, job_id, self._env)
        if home is None:
            self._unreadable(job_id, f"{self.template!r} names an unset variable")
            return None
        try:
            key = NodeKey.load(home / NODE_KEY_FILE)
        except KeyFileError as exc:
            self._unreadable(job_id, str(exc))
            return None
        self._peers[job_id] = key.peer_id
        self._unread.discard(job_id)
        return key.peer_id

    def _unreadable(self, job_id: str, why: str) -> None:
        if job_id not in self._unread:
            self._unread.add(job_id)
            log.info("job %s: its node key is not readable yet (%s); its records are those "
                     "claiming it", job_id, why)

    def keep(self, job_ids: set[str]) -> None:
        """Forget the jobs that left the queue."""
        self._peers = {j: p for j, p in self._peers.items() if j in job_ids}
        self._unread &= job_ids
