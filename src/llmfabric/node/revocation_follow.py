"""How a running node follows the operator's revocation list (node/revocations.py reads it
from the file and learns it from peers; this module wires that to the node's parts).

    revoking = follow_revocations(config, revocations, transport, clock, rng, me=..., ...)
    revoking.own_revocation()    # at start: why the list held revokes this node, or None
    for name, run in revoking.loops(): supervisor.loop(name, run)
    revoking.reload()            # SIGHUP: poll the file now

At start the list comes from `--revocation-list` (a file that cannot be read or verified
stops the start) and from the copy learnt before a restart (under --home); its members are
refused at the handshake from then on. While running, a list put in force (`apply`: from
the file, SIGHUP or a peer) closes the revoked members' connections and drops their
registry sessions and data-plane session keys (`revoked_members` says which); one that
names this node's own key or certificate goes to `on_own_revocation` (the daemon leaves
and exits). The list held is advertised in the node's record and kept under --home.
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import Awaitable, Callable, Iterable

from llmfabric.clock import Clock, utc_time
from llmfabric.gossip.agent import GossipAgent
from llmfabric.identity.revocation import RevocationList, Revocations
from llmfabric.net import TlsTransport
from llmfabric.node.config import NodeConfig
from llmfabric.node.revocations import (
    Advert,
    RevocationSync,
    RevocationWatch,
    fetch_list,
    load_saved,
    save_list,
)
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.registry.views import NodeView
from llmfabric.untrusted import get_logger

log = get_logger(__name__)


class RevocationFollower:
    def __init__(
        self, revocations: Revocations, home: pathlib.Path, path: pathlib.Path | None,
        transport: TlsTransport, clock: Clock, rng: random.Random, *, me: str,
        own_cert_id: str, session: Callable[[], GossipAgent | None],
        revoked_record: Callable[[NodeRecord], bool], republish: Callable[[], None],
        drop_session_keys: Callable[[str], int], on_own_revocation: Callable[[str], None],
    ) -> None:
        """`path`: --revocation-list (None: only lists learnt from peers); `me`, `own_cert_id`:
        this node's key and the certificate it publishes; `session()`: the current gossip
        session, if any; `revoked_record(record)`: its key or certificate is revoked
        (ProviderVerifier.revoked); `republish()`: publish the node's record again (it
        advertises the list held); `drop_session_keys(peer)`: forget its data-plane session
        keys, returning how many; `on_own_revocation(why)`: a list in force names us."""
        self.revocations = revocations
        self.home = home
        self.transport = transport
        self.me = me
        self.own_cert_id = own_cert_id
        self.session = session
        self.revoked_record = revoked_record
        self.republish = republish
        self.drop_session_keys = drop_session_keys
        self.on_own_revocation = on_own_revocation
        self.watch = (RevocationWatch(path, revocations, clock, self.apply)
                      if path is not None else None)
        self.sync = RevocationSync(
            revocations, clock, self._adverts, lambda peer: fetch_list(transport, peer),
            self.apply, held_changed=self._held_changed, rng=rng)

    def load(self) -> None:
        """At start: the file (AdmissionError with the reason when it cannot be read or
        verified), then the copy learnt before a restart; refuse the members they revoke."""
        if self.watch is not None:
            self.watch.load_initial()
        load_saved(self.home, self.revocations)
        if self.revocations.current is not None:
            self.transport.refused = self.revocations.current.peer_ids

    def own_revocation(self) -> str | None:
        """Why the list held revokes this node, or None."""
        return own_revocation(self.revocations.current, self.me, self.own_cert_id)

    def loops(self) -> list[tuple[str, Callable[[], Awaitable[None]]]]:
        """(name, run) of the node tasks that follow the file and the peers' lists."""
        loops: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if self.watch is not None:
            loops.append(("revocations", self.watch.run))
        loops.append(("revocation-sync", self.sync.run))
        return loops

    def reload(self) -> None:
        """SIGHUP: re-read the file now (a broken one is logged; the list in force stays)."""
        if self.watch is not None:
            self.watch.poll()
            self.sync.check_held()

    def _adverts(self) -> list[tuple[str, Advert]]:
        """(peer, the list it advertises) of live sessions other than ours that hold one."""
        agent = self.session()
        if agent is None:
            return []
        return advertised_lists(agent.nodes.all(include_left=False), self.me)

    def _held_changed(self, rl: RevocationList) -> None:
        """The list held changed (file, SIGHUP, a peer): advertise it and keep a copy."""
        self.republish()
        save_list(self.home, rl)

    def apply(self, rl: RevocationList) -> None:
        """A new revocation list is in force: its handshakes already refuse the revoked
        members; close their connections, drop their registry sessions and their data-plane
        session keys (`revoked_members`: which). On the list ourselves: `on_own_revocation`."""
        agent = self.session()
        keys, by_cert, running = revoked_members(
            rl, agent.nodes.all() if agent is not None else (), self.revoked_record, self.me)
        why = own_revocation(rl, self.me, self.own_cert_id)
        if why is not None:
            self.on_own_revocation(why)
        closed = self.transport.refuse_peers(keys)
        closed += sum(self.transport.disconnect(p) for p in running)
        dropped = 0
        if agent is not None:
            dropped = (sum(len(agent.purge_peer(p)) for p in keys)
                       + sum(len(agent.purge_peer(p, sids)) for p, sids in by_cert.items()))
        session_keys = sum(self.drop_session_keys(p) for p in keys | running)
        log.warning("revocations applied: %d connection(s) closed, %d registry session(s) "
                    "and %d data-plane session key(s) dropped", closed, dropped, session_keys)


def follow_revocations(
    config: NodeConfig, revocations: Revocations | None, transport: TlsTransport,
    clock: Clock, rng: random.Random, *, me: str, own_cert_id: str,
    session: Callable[[], GossipAgent | None], revoked_record: Callable[[NodeRecord], bool],
    republish: Callable[[], None], drop_session_keys: Callable[[str], int],
    on_own_revocation: Callable[[str], None],
) -> RevocationFollower | None:
    """A loaded `RevocationFollower` (arguments: its constructor), or None on pre-shared-
    secret networks (no `revocations`). AdmissionError: --revocation-list cannot be read or
    verified."""
    if revocations is None:
        return None
    follower = RevocationFollower(
        revocations, config.home, config.revocation_list, transport, clock, rng, me=me,
        own_cert_id=own_cert_id, session=session, revoked_record=revoked_record,
        republish=republish, drop_session_keys=drop_session_keys,
        on_own_revocation=on_own_revocation)
    follower.load()
    return follower


# ---- what a list in force means for this node ------------------------------------------------
def own_revocation(rl: RevocationList | None, peer_id: str, cert_id: str) -> str | None:
    """Why `rl` revokes this node (its key `peer_id`, or the certificate `cert_id` it
    publishes), or None. An older session's record on a revoked certificate does not count:
    the node has since been re-certified."""
    if rl is None or not rl.revokes(peer_id, cert_id):
        return None
    what = "key" if peer_id in rl.peer_ids else "certificate"
    return (f"this node's own membership is revoked: its {what} is on the operator's "
            f"revocation list (issued at {utc_time(rl.issued_at)})")


def revoked_members(rl: RevocationList, views: Iterable[NodeView],
                    revoked: Callable[[NodeRecord], bool], me: str
                    ) -> tuple[set[str], dict[str, list[str]], set[str]]:
    """(the revoked keys, peer -> its sessions on a revoked certificate, the peers with such
    a session not LEFT), this node `me` left out. A certificate revoked by id revokes the
    sessions whose records carry it (`revoked(record)`), not the key's others: a member
    re-certified under a new certificate keeps its new session (the old one's record, LEFT,
    is still held for retention: purging every session of the key tombstoned the new one
    too, and the member was gone from every node's view until it restarted); its connection
    is closed only while a session on the revoked certificate is not LEFT."""
    keys = set(rl.peer_ids) - {me}
    by_cert: dict[str, list[str]] = {}
    running: set[str] = set()
    for v in views:
        rec = v.record
        if rec.peer_id in keys or rec.peer_id == me or not revoked(rec):
            continue
        by_cert.setdefault(rec.peer_id, []).append(rec.session_id)
        if v.state is not Lifecycle.LEFT:
            running.add(rec.peer_id)
    return keys, by_cert, running


def advertised_lists(views: Iterable[NodeView], me: str) -> list[tuple[str, Advert]]:
    """(peer, the list it advertises) of the sessions in `views` other than ours that hold
    one (RevocationSync's `adverts`)."""
    return [(v.record.peer_id, (m.revocations_at, m.revocations_digest)) for v in views
            if (m := v.record.meta).revocations_at > 0 and v.record.peer_id != me]
