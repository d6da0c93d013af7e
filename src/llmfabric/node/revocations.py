"""The node's revocation list: from the operator's file and from the other nodes, and the
node following it.

Both sources feed the shared `Revocations` (identity/revocation.py); a list put in force goes
to `RevocationFollower.apply` (close the revoked members' connections, drop what the node
holds of them). The daemon wires it so:

    revoking = follow_revocations(config, revocations, transport, clock, rng, me=..., ...)
    revoking.own_revocation()    # at start: why the list held revokes this node, or None
    for name, run in revoking.loops(): supervisor.loop(name, run)
    revoking.reload()            # SIGHUP: poll the file now

## The file (`RevocationWatch`, `--revocation-list FILE`)

Read at start (a list that cannot be read or verified stops the start: the operator asked
for revocations, and starting without them would admit revoked members). Then the file is
polled every `POLL_S` seconds on the node's clock (its size, mtime and inode; SIGHUP polls
at once): a changed file is read, verified against the operator key and offered to the
shared `Revocations` (identity/revocation.py). A file that fails to read, parse or verify,
or holds a list older than the one in force, is refused with a logged error and the list in
force stays (never an empty one); the error is logged once per version of the file. A list
put in force calls `on_change(list)`, which closes the revoked members' connections and
drops what the node holds of them (`RevocationFollower.apply`).

## The other nodes (`RevocationSync`)

A list handed to one node (its `--revocation-list` file) reaches every node:

- Each node advertises in its signed record which list it holds: `NodeMeta.revocations_at`
  and `revocations_digest` (the list's issue time and `RevocationList.digest`; unset while
  it holds none). Lists are ordered by (issue time, digest): `keys revoke-node` makes each
  list strictly newer, and the digest settles two lists of one issue time the same way
  everywhere.
- A node that sees a live peer advertise a newer list than its own asks that peer for it
  over the peer protocol (`GET /_fabric/v1/revocations`: the list's JSON, or 404 while the
  peer holds none), verifies it against the operator key and offers it to the shared
  `Revocations` (identity/revocation.py): only the operator's signature counts, never the
  peer's word, and an older list never replaces a newer one. A list put in force goes the
  file's way (`RevocationFollower.apply` closes the revoked members' connections and drops
  what the node holds of them), and the node then advertises it in turn: the list
  spreads like a rumour, each node fetching it once, from a peer picked at random among
  those that advertise a newer one (so not everyone from the first node).
- Bounded: one fetch at a time, at most one per scan (`SCAN_S`, jittered); the whole answer
  within `FETCH_TIMEOUT_S` and at most `MAX_LIST_BYTES`. A peer whose fetch failed
  (unreachable, an error status, a list too large, unparsable, not the operator's, of
  another network, not newer than ours, or older than it advertised) is not asked again
  for `BACKOFF_S`, doubling up to `MAX_BACKOFF_S`, per peer id: a member that advertises
  ever newer lists it cannot produce is asked about once an hour at most, and is never
  believed; honest peers that advertise the same list are asked meanwhile.
- Answers are rate limited per asking peer (`handle`): one answer per peer per
  `ANSWER_INTERVAL_S` (30 s) for the same list, 429 with `Retry-After` otherwise; a peer
  asks again for a list held since its last answer at once. The table of askers is
  bounded (`MAX_ASKERS`): past it, the peer answered longest ago is forgotten first (so at
  most `MAX_ASKERS` answers per interval, whoever asks). An honest node fetches a list
  once, so only a peer that asks again for the list it was just given is refused (and
  backs off as after any failed fetch).
- The newest list held is kept under the state directory (`LEARNT_FILE` in --home,
  written whole then renamed), so a restarted node keeps what it learnt; it is read back at
  start (a broken or older copy is logged and skipped: the peers teach it again).

On PSK networks there is no operator key and nothing is advertised, served or fetched.

## The node following it (`RevocationFollower`, `follow_revocations`)

At start the list comes from `--revocation-list` (a file that cannot be read or verified
stops the start) and from the copy learnt before a restart (under --home); its members are
refused at the handshake from then on. While running, a list put in force (`apply`: from
the file, SIGHUP or a peer) closes the revoked members' connections and drops their
registry sessions and data-plane session keys (`revoked_members` says which); one that
names this node's own key or certificate goes to `on_own_revocation` (the daemon leaves
and exits). The list held is advertised in the node's record and kept under --home.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import random
from collections.abc import Awaitable, Callable, Iterable

import orjson

from llmfabric.clock import Clock, utc_time, with_timeout
from llmfabric.gossip.agent import GossipAgent
from llmfabric.identity.errors import AdmissionError
from llmfabric.identity.revocation import MAX_LIST_BYTES, RevocationList, Revocations
from llmfabric.net import HandlerResponse, NetError, PeerRequest, TlsTransport
from llmfabric.net.errors import BodyTooLarge
from llmfabric.node.config import NodeConfig
from llmfabric.registry.records import Lifecycle, NodeRecord
from llmfabric.registry.views import NodeView
from llmfabric.untrusted import get_logger

log = get_logger(__name__)

POLL_S = 5.0

_Stamp = tuple[int, int, int, int] | None  # (device, inode, size, mtime_ns); None: missing


def _stamp(path: pathlib.Path) -> _Stamp:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class RevocationWatch:
    def __init__(
        self, path: pathlib.Path, revocations: Revocations, clock: Clock,
        on_change: Callable[[RevocationList], None], *, interval_s: float = POLL_S,
    ) -> None:
        self.path = path
        self.revocations = revocations
        self.clock = clock
        self.on_change = on_change
        self.interval_s = interval_s
        self._seen: _Stamp = None  # the version of the file last read (good or refused)
        self.refused = 0  # versions of the file refused (tests, logs)

    def load_initial(self) -> RevocationList:
        """Read and verify the list at start; AdmissionError (with the reason) if it fails."""
        self._seen = _stamp(self.path)
        rl = RevocationList.load(self.path)
        self.revocations.offer(rl)
        return rl

    def poll(self) -> bool:
        """Re-read the file if it changed; return whether a new list was put in force."""
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return False
        self._seen = stamp
        if stamp is None:
            self.refused += 1
            log.error("revocation list %s is gone; keeping the list in force", self.path)
            return False
        try:
            rl = RevocationList.load(self.path)
            changed = self.revocations.offer(rl)
        except AdmissionError as exc:
            self.refused += 1
            log.error("revocation list %s refused, keeping the list in force: %s",
                      self.path, exc)
            return False
        log.warning("revocation list %s in force: %d key(s), %d certificate(s) revoked "
                    "(issued at %s)", self.path, len(rl.peer_ids), len(rl.cert_ids),
                    utc_time(rl.issued_at))
        if changed:
            self.on_change(rl)
        return changed

    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.interval_s)
            self.poll()


# ---- the other nodes ------------------------------------------------------------------

REVOCATIONS_PATH = "/_fabric/v1/revocations"
LEARNT_FILE = "revocations.json"
SCAN_S = 2.0  # how often the replica's adverts are compared with the list held
FETCH_TIMEOUT_S = 10.0  # the whole answer, body included
BACKOFF_S = 30.0  # a peer whose fetch failed is not asked again for this long, doubling
MAX_BACKOFF_S = 3600.0
MAX_TRACKED = 4096  # peers remembered in backoff (admitted members only)
ANSWER_INTERVAL_S = 30.0  # one answer per asking peer per this long, for the same list
MAX_ASKERS = 4096  # asking peers remembered for the rate limit

Advert = tuple[float, bytes]  # (issued_at, digest) of a list; NONE: no list
NONE: Advert = (0.0, b"")
_JSON = (("content-type", "application/json"),)


class FetchError(Exception):
    """A peer did not answer a list (status, size); the message says how."""


def advert_of(rl: RevocationList | None) -> Advert:
    return NONE if rl is None else (rl.issued_at, rl.digest)


class RevocationSync:
    """Learns newer lists from peers (`run`), answers the peers' requests (`handle`)."""

    def __init__(
        self, revocations: Revocations, clock: Clock,
        adverts: Callable[[], Iterable[tuple[str, Advert]]],
        fetch: Callable[[str], Awaitable[bytes]],
        apply: Callable[[RevocationList], None],
        *, held_changed: Callable[[RevocationList], None] | None = None,
        rng: random.Random | None = None, scan_s: float = SCAN_S,
    ) -> None:
        """`adverts()`: (peer id, advert) of the live peers (not us); `fetch(peer)`: the
        body of the peer's answer to REVOCATIONS_PATH (raises NetError, FetchError or
        OSError); `apply(list)`: a list that changed what is revoked was put in force;
        `held_changed(list)`: the list held is not the one last advertised (republish,
        persist), from a peer, the file or SIGHUP."""
        self.revocations = revocations
        self.clock = clock
        self.adverts = adverts
        self.fetch = fetch
        self.apply = apply
        self.held_changed = held_changed
        self.rng = rng or random.Random()
        self.scan_s = scan_s
        self._backoff: dict[str, tuple[float, float]] = {}  # peer -> (until, delay)
        self._announced: Advert = NONE
        self._served: tuple[RevocationList, bytes] | None = None
        self._asked: dict[str, tuple[float, Advert]] = {}  # peer -> (answered at, list)
        # counters (tests, logs)
        self.fetches = 0
        self.learnt = 0
        self.failed = 0
        self.answered = 0
        self.rate_limited = 0
        self.askers_evicted = 0

    def held(self) -> Advert:
        return advert_of(self.revocations.current)

    # ---- learning from peers ------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await self.clock.sleep(self.scan_s * (0.5 + self.rng.random()))
            self.check_held()
            await self.step()

    def check_held(self) -> None:
        """Tell `held_changed` when the list held moved since it was last told."""
        rl = self.revocations.current
        if rl is None or advert_of(rl) == self._announced:
            return
        self._announced = advert_of(rl)
        if self.held_changed is not None:
            self.held_changed(rl)

    def candidates(self) -> list[tuple[str, Advert]]:
        """Peers that advertise a newer list than ours and are not in backoff."""
        mine, now = self.held(), self.clock.now()
        best: dict[str, Advert] = {}
        for peer, advert in self.adverts():
            if advert > mine and advert > best.get(peer, NONE):
                best[peer] = advert
        return [(p, a) for p, a in best.items()
                if self._backoff.get(p, (0.0, 0.0))[0] <= now
                and self.revocations.refusal(p) is None]

    async def step(self) -> bool:
        """Fetch from one peer that advertises a newer list; return whether a list was
        learnt (put in force)."""
        cands = self.candidates()
        if not cands:
            return False
        peer, advertised = self.rng.choice(sorted(cands))
        self.fetches += 1
        try:
            body = await with_timeout(self.clock, self.fetch(peer), FETCH_TIMEOUT_S)
            rl = RevocationList.from_json(body)
            got = advert_of(rl)
            if got <= self.held():
                raise AdmissionError(
                    f"it served a list issued at {utc_time(rl.issued_at)}, not newer than ours")
            changed = self.revocations.offer(rl)  # (raises unless the operator signed it)
        except TimeoutError:
            self._fail(peer, f"no answer within {FETCH_TIMEOUT_S:g} s", quiet=True)
            return False
        except (NetError, FetchError, OSError) as exc:
            self._fail(peer, str(exc)[:200], quiet=True)
            return False
        except AdmissionError as exc:
            self._fail(peer, str(exc)[:300], quiet=False)
            return False
        self.learnt += 1
        if got < advertised:  # a genuine list, but not the one it advertised: ask others
            self._fail(peer, "it advertised a newer list than it served", quiet=False)
        else:
            self._backoff.pop(peer, None)
        log.warning("revocation list issued at %s learnt from peer %s: %d key(s), %d "
                    "certificate(s) revoked", utc_time(rl.issued_at), peer, len(rl.peer_ids),
                    len(rl.cert_ids))
        if changed:
            self.apply(rl)
        self.check_held()
        return True

    def _fail(self, peer: str, why: str, *, quiet: bool) -> None:
        self.failed += 1
        now = self.clock.now()
        delay = min(MAX_BACKOFF_S, self._backoff.get(peer, (0.0, BACKOFF_S / 2))[1] * 2)
        if peer not in self._backoff and len(self._backoff) >= MAX_TRACKED:
            for p in [p for p, (until, _) in self._backoff.items() if until <= now]:
                del self._backoff[p]
            if len(self._backoff) >= MAX_TRACKED:  # (all in backoff: drop the oldest)
                del self._backoff[next(iter(self._backoff))]
        self._backoff[peer] = (now + delay, delay)
        (log.info if quiet else log.warning)(
            "revocation list from peer %s refused (asking it again in %.0f s): %s",
            peer, delay, why)

    # ---- answering peers -----------------------------------------------------------------
    def handles(self, path: str) -> bool:
        return path == REVOCATIONS_PATH

    async def handle(self, request: PeerRequest) -> HandlerResponse:
        if request.method != "GET":
            return HandlerResponse(405, _JSON, orjson.dumps(
                {"error": {"message": "GET the revocation list"}}))
        wait = self._wait(request.peer_id)
        if wait > 0:
            self.rate_limited += 1
            return HandlerResponse(429, (*_JSON, ("retry-after", str(math.ceil(wait)))),
                                   orjson.dumps({"error": {"message": (
                                       f"this node answered you its revocation list less "
                                       f"than {ANSWER_INTERVAL_S:g} s ago")}}))
        self.answered += 1
        body = self.answer()
        if body is None:
            return HandlerResponse(404, _JSON, orjson.dumps(
                {"error": {"message": "this node holds no revocation list"}}))
        return HandlerResponse(200, _JSON, body)

    def _wait(self, peer: str) -> float:
        """Seconds before `peer` may have the list held again (0: answer it now, recorded).
        Any member could ask in a loop, up to 1 MiB an answer (the body is cached: the
        cost is bandwidth)."""
        now, held, asked = self.clock.now(), self.held(), self._asked
        last = asked.get(peer)
        if last is not None and last[1] == held and now < last[0] + ANSWER_INTERVAL_S:
            return last[0] + ANSWER_INTERVAL_S - now
        asked.pop(peer, None)  # (the table stays in the order peers were answered)
        while asked:  # oldest first: those answered an interval ago are forgotten
            first, (at, _) = next(iter(asked.items()))
            fresh = now < at + ANSWER_INTERVAL_S
            if fresh and len(asked) < MAX_ASKERS:
                break
            self.askers_evicted += fresh  # (a full table of recent askers: the oldest goes)
            del asked[first]
        asked[peer] = (now, held)
        return 0.0

    def answer(self) -> bytes | None:
        """The list held, as JSON (cached per list), or None."""
        rl = self.revocations.current
        if rl is None:
            return None
        if self._served is None or self._served[0] is not rl:
            self._served = (rl, rl.to_json().encode())
        return self._served[1]


async def fetch_list(transport: TlsTransport, peer: str) -> bytes:
    """The body of `peer`'s answer to REVOCATIONS_PATH (at most MAX_LIST_BYTES)."""
    resp = await transport.request(peer, "GET", REVOCATIONS_PATH, timeout=FETCH_TIMEOUT_S)
    async with resp:
        try:
            body = await resp.read(MAX_LIST_BYTES)
        except BodyTooLarge:
            raise FetchError(f"its list is over {MAX_LIST_BYTES} bytes") from None
    if resp.status != 200:
        raise FetchError(f"it answered {resp.status}")
    return body


# ---- the copy under the state directory ---------------------------------------------------
def save_list(home: pathlib.Path, rl: RevocationList) -> None:
    """Write the list held to `home/LEARNT_FILE` (whole, then renamed); logged on failure."""
    path = home / LEARNT_FILE
    tmp = home / f".{LEARNT_FILE}.{os.getpid()}.tmp"
    try:
        # A fresh file, never one found there (O_EXCL, O_NOFOLLOW): O_TRUNC on a link that
        # someone who may write --home planted at this name overwrote its target with our
        # rights. A leftover (a crash between open and rename) is removed first; unlink
        # removes a link, not its target. os.replace swaps the name itself, links included.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(rl.to_json() + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        log.error("cannot keep the revocation list in %s (a restart forgets it until a "
                  "peer teaches it again): %s", path, exc)


def load_saved(home: pathlib.Path, revocations: Revocations) -> RevocationList | None:
    """Offer the list kept in `home/LEARNT_FILE` (if any) to `revocations`; the list put in
    force, or None (no copy; a broken, foreign or older copy is logged and skipped)."""
    path = home / LEARNT_FILE
    if not path.exists():
        return None
    try:
        rl = RevocationList.load(path)
        revocations.offer(rl)
    except AdmissionError as exc:
        log.warning("the revocation list kept in %s is skipped: %s", path, exc)
        return None
    return rl


# ---- the node following the list -------------------------------------------------------------
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
