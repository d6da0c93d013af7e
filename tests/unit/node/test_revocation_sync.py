"""Revocation lists spread through the fabric (node/revocations.py), on virtual time over
the in-memory network: a list handed to one node reaches every node through the adverts in
their signed records and fetches from peers, and they drop the revoked member; a hostile
member that advertises ever newer lists and serves forged, foreign, older or garbled ones is
never believed and is asked only at a backed-off pace, while the honest list is still learnt
from another peer."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import pathlib
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable

import orjson
import pytest

from llmfabric.gossip.agent import GossipAgent
from llmfabric.gossip.config import PRESETS
from llmfabric.identity.admission import sign_membership
from llmfabric.identity.keys import NodeKey
from llmfabric.identity.revocation import RevocationList, Revocations, sign_revocations
from llmfabric.net.messages import BodyStream, PeerRequest
from llmfabric.node import revocations as revocations_mod
from llmfabric.node.revocations import (
    ANSWER_INTERVAL_S,
    BACKOFF_S,
    LEARNT_FILE,
    NONE,
    REVOCATIONS_PATH,
    Advert,
    FetchError,
    RevocationSync,
    advert_of,
    load_saved,
    save_list,
)
from llmfabric.registry.provider import CertRecordPolicy, ProviderVerifier
from llmfabric.registry.records import Lifecycle, NodeMeta, ServedModel
from llmfabric.testing.fake_clock import FakeClock
from llmfabric.testing.memnet import MemNet

NET = "lab"
OPERATOR = NodeKey.generate()


def _get(peer: str, method: str = "GET") -> PeerRequest:
    return PeerRequest(peer, method, REVOCATIONS_PATH, (), BodyStream(lambda n: None,
                                                                      lambda: None))


@dataclasses.dataclass
class Member:
    agent: GossipAgent
    revs: Revocations
    sync: RevocationSync | None  # (None: the leaked member, which fetches nothing)


class Fabric:
    """Gossip agents on a certificate network, each with its revocation sync; a fetch is a
    peer request that takes 50 ms (or what `serve` says for hostile peers)."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.net = MemNet(self.clock, seed=3)
        self.members: dict[str, Member] = {}
        self.fetched: Counter[tuple[str, str]] = Counter()  # (who, from whom)
        self.serve: dict[str, Callable[[], bytes]] = {}  # hostile answers, by peer
        self.tasks: list[asyncio.Future[None]] = []

    async def add(self, key: NodeKey, *, sync: bool = True) -> Member:
        clock = self.clock
        revs = Revocations(OPERATOR.public_bytes, NET)
        cert = sign_membership(OPERATOR, key.peer_id, NET, clock.wall() + 86400)
        verifier = ProviderVerifier(OPERATOR.public_bytes, NET, clock.wall, revs)
        agent = GossipAgent(
            self.net.transport(key.peer_id), clock, key,
            NodeMeta(provider_id="p", models=(ServedModel("m"),), cert=cert.to_json()),
            config=PRESETS["local"], seeds=list(self.members)[:1],
            rng=random.Random(len(self.members)), policy=CertRecordPolicy(verifier))
        await agent.start()
        agent.set_state(Lifecycle.SERVING)
        me = key.peer_id

        def adverts() -> list[tuple[str, Advert]]:
            return [(v.record.peer_id, (v.record.meta.revocations_at,
                                        v.record.meta.revocations_digest))
                    for v in agent.nodes.all(include_left=False)
                    if v.record.peer_id != me and v.record.meta.revocations_at > 0]

        async def fetch(peer: str) -> bytes:
            self.fetched[(me, peer)] += 1
            await clock.sleep(0.05)
            if peer in self.serve:
                return self.serve[peer]()
            other = self.members[peer].sync
            if other is None:
                raise FetchError("it answered 404")
            resp = await other.handle(_get(me))  # (rate limited per asking peer)
            if resp.status != 200:
                raise FetchError(f"it answered {resp.status}")
            assert isinstance(resp.body, bytes)
            return resp.body

        def apply(rl: RevocationList) -> None:
            for p in rl.peer_ids:
                agent.purge_peer(p)

        def held_changed(rl: RevocationList) -> None:
            agent.update_self(dataclasses.replace(
                agent.record.meta, revocations_at=rl.issued_at, revocations_digest=rl.digest))

        rs = RevocationSync(revs, clock, adverts, fetch, apply, held_changed=held_changed,
                            rng=random.Random(len(self.members))) if sync else None
        member = Member(agent, revs, rs)
        self.members[me] = member
        return member

    def run_syncs(self, *members: Member) -> None:
        for m in members or tuple(self.members.values()):
            if m.sync is not None:
                self.tasks.append(asyncio.ensure_future(m.sync.run()))

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        for m in self.members.values():
            await m.agent.aclose()
        await self.net.aclose()


@pytest.fixture
async def fabric() -> AsyncIterator[Fabric]:
    f = Fabric()
    try:
        yield f
    finally:
        await f.aclose()


def _give(member: Member, rl: RevocationList) -> None:
    """The node's file watch put `rl` in force (node/revocations.py)."""
    assert member.revs.offer(rl)
    for p in rl.peer_ids:
        member.agent.purge_peer(p)


async def test_a_list_given_to_one_node_reaches_every_node(fabric: Fabric) -> None:
    f = fabric
    honest = [await f.add(NodeKey.generate()) for _ in range(4)]
    leaked_key = NodeKey.generate()
    await f.add(leaked_key, sync=False)
    f.run_syncs()
    assert await f.clock.run_until(lambda: all(
        len(m.agent.nodes.routable()) == 5 for m in honest), within=60)

    rl = sign_revocations(OPERATOR, NET, f.clock.wall(), [leaked_key.peer_id])
    _give(honest[0], rl)
    assert await f.clock.run_until(lambda: all(
        m.revs.current == rl and m.agent.nodes.by_peer(leaked_key.peer_id) == []
        for m in honest), within=60)
    # each node fetched it once; every node advertises it now
    assert all(n == 1 for n in f.fetched.values()) and len(f.fetched) == 3
    await f.clock.advance(30)
    assert all(m.agent.record.meta.revocations_at == rl.issued_at
               and m.agent.record.meta.revocations_digest == rl.digest for m in honest)
    assert all(len(m.agent.nodes.routable()) == 4 for m in honest)

    # a newer list (that un-revokes the key and revokes another) replaces it everywhere
    other = NodeKey.generate().peer_id
    newer = sign_revocations(OPERATOR, NET, f.clock.wall() + 5, [other])
    _give(honest[3], newer)
    assert await f.clock.run_until(lambda: all(m.revs.current == newer for m in honest),
                                   within=60)
    assert sum(f.fetched.values()) == 6 and all(m.sync is None or m.sync.failed == 0
                                                for m in honest)


async def _hostile_fabric(f: Fabric, serves: Callable[[int], bytes]
                          ) -> tuple[list[Member], Member, RevocationList]:
    honest = [await f.add(NodeKey.generate()) for _ in range(3)]
    hostile = await f.add(NodeKey.generate(), sync=False)
    bad_peer = hostile.agent.peer_id
    asked = Counter[str]()

    def serve() -> bytes:
        asked["n"] += 1
        return serves(asked["n"])

    f.serve[bad_peer] = serve
    f.run_syncs()
    assert await f.clock.run_until(lambda: all(
        len(m.agent.nodes.routable()) == 4 for m in honest), within=60)
    rl = sign_revocations(OPERATOR, NET, f.clock.wall(), [NodeKey.generate().peer_id])
    _give(honest[0], rl)
    return honest, hostile, rl


async def _advertise_ever_newer(f: Fabric, hostile: Member, seconds: float) -> None:
    """The hostile member re-advertises a list newer than any every 10 s."""
    for i in range(int(seconds / 10)):
        hostile.agent.update_self(dataclasses.replace(
            hostile.agent.record.meta, revocations_at=f.clock.wall() + 1e6 + i,
            revocations_digest=bytes([i % 256]) * 8))
        await f.clock.advance(10)


@pytest.mark.hostile
async def test_a_member_advertising_newer_lists_it_cannot_produce_is_not_believed(
        fabric: Fabric) -> None:
    f = fabric
    wall = f.clock.wall()
    forged = [
        sign_revocations(NodeKey.generate(), NET, wall + 1e6).to_json().encode(),  # forged
        sign_revocations(OPERATOR, "other", wall + 1e6).to_json().encode(),  # foreign
        b"{ not a list",  # garbled
        b"x" * (1 << 20),  # junk
        b"",
    ]
    # (its lists are tampered: re-signed content under another issue time)
    tampered = RevocationList.from_json(
        sign_revocations(OPERATOR, NET, wall).to_json())
    forged.append(dataclasses.replace(tampered, issued_at=wall + 1e6).to_json().encode())
    honest, hostile, rl = await _hostile_fabric(f, lambda n: forged[n % len(forged)])
    bad = hostile.agent.peer_id
    await _advertise_ever_newer(f, hostile, 1800)

    for m in honest:  # the honest list was learnt from node 0, and only it is in force
        assert m.revs.current == rl
        assert m.agent.record.meta.revocations_at == rl.issued_at
    # each node asked the liar at a backed-off pace: 0, 30, 90, 210, 450, 930 s ... (not
    # once per advert or per scan)
    for m in honest:
        n = f.fetched[(m.agent.peer_id, bad)]
        assert 3 <= n <= 7, n
        assert m.sync is not None and m.sync.failed == n
    assert f.fetched[(honest[1].agent.peer_id, honest[0].agent.peer_id)] == 1
    assert f.fetched[(honest[2].agent.peer_id, honest[0].agent.peer_id)] <= 1


@pytest.mark.hostile
async def test_an_older_genuine_list_does_not_roll_back_and_its_server_is_backed_off(
        fabric: Fabric) -> None:
    """The liar serves a genuine list, but an older one than it advertises (to withdraw a
    revocation): nodes that hold none may take it (it is the operator's), never over the
    newer list, and the honest list is learnt from node 0 in the end."""
    f = fabric
    old = sign_revocations(OPERATOR, NET, f.clock.wall() - 3600).to_json().encode()
    honest, hostile, rl = await _hostile_fabric(f, lambda n: old)
    bad = hostile.agent.peer_id
    await _advertise_ever_newer(f, hostile, 900)
    for m in honest:
        assert m.revs.current == rl
        assert f.fetched[(m.agent.peer_id, bad)] <= 5


@pytest.mark.hostile
async def test_a_node_without_a_list_learns_it_when_it_joins(fabric: Fabric) -> None:
    f = fabric
    _, hostile, rl = await _hostile_fabric(
        f, lambda n: sign_revocations(NodeKey.generate(), NET, 1.0).to_json().encode())
    await _advertise_ever_newer(f, hostile, 60)
    late = await f.add(NodeKey.generate())
    f.run_syncs(late)
    assert await f.clock.run_until(lambda: late.revs.current == rl, within=120)


def test_candidates_and_backoff_are_per_peer_and_bounded() -> None:
    clock = FakeClock()
    revs = Revocations(OPERATOR.public_bytes, NET)
    adverts: list[tuple[str, Advert]] = []

    async def fetch(peer: str) -> bytes:
        raise FetchError("no")

    sync = RevocationSync(revs, clock, lambda: adverts, fetch, lambda rl: None)
    assert sync.held() == NONE and advert_of(None) == NONE and sync.answer() is None
    rl = sign_revocations(OPERATOR, NET, 1_700_000_000.0)
    revs.offer(rl)
    assert sync.held() == (rl.issued_at, rl.digest)
    assert sync.answer() == rl.to_json().encode() and sync.answer() is sync.answer()
    a, b = NodeKey.generate().peer_id, NodeKey.generate().peer_id
    adverts[:] = [(a, (rl.issued_at, rl.digest)), (b, (rl.issued_at + 1, b"")),
                  (b, (rl.issued_at + 2, b""))]
    assert sync.candidates() == [(b, (rl.issued_at + 2, b""))]  # (not an equal list)
    sync._fail(b, "test", quiet=True)
    assert sync.candidates() == []
    clock._now += BACKOFF_S  # type: ignore[attr-defined]
    assert sync.candidates() != []
    sync._fail(b, "test", quiet=True)  # doubled
    clock._now += BACKOFF_S  # type: ignore[attr-defined]
    assert sync.candidates() == []
    # a revoked peer is never asked
    revs.offer(sign_revocations(OPERATOR, NET, rl.issued_at + 0.5, [b]))
    clock._now += 10 * BACKOFF_S  # type: ignore[attr-defined]
    assert sync.candidates() == []


def test_the_list_held_is_kept_under_the_state_directory(tmp_path: pathlib.Path) -> None:
    revs = Revocations(OPERATOR.public_bytes, NET)
    assert load_saved(tmp_path, revs) is None
    rl = sign_revocations(OPERATOR, NET, 1_700_000_000.0, [NodeKey.generate().peer_id])
    save_list(tmp_path, rl)
    assert (tmp_path / LEARNT_FILE).stat().st_mode & 0o077 == 0
    assert load_saved(tmp_path, revs) == rl and revs.current == rl
    # an older or foreign copy is skipped; the list in force stays
    revs2 = Revocations(OPERATOR.public_bytes, NET)
    newer = sign_revocations(OPERATOR, NET, 1_700_000_001.0)
    revs2.offer(newer)
    assert load_saved(tmp_path, revs2) is None and revs2.current == newer
    (tmp_path / LEARNT_FILE).write_text(
        sign_revocations(NodeKey.generate(), NET, 1_800_000_000.0).to_json())
    assert load_saved(tmp_path, revs2) is None and revs2.current == newer


@pytest.mark.hostile
async def test_digits_past_the_signed_milliseconds_do_not_make_a_list_newer() -> None:
    """Review 2026-12-02: only the milliseconds of issued_at are signed. A member that added
    digits to a genuine list's issue time (t + 0.0004: the signature still verified) had it
    taken as newer than itself; the node that learnt it advertised (t + 0.0004, digest) but
    served the list rounded (to_json), so every peer saw a node advertising a list it never
    served, backed it off as a liar (up to an hour) and kept refetching."""
    clock = FakeClock()
    revs = Revocations(OPERATOR.public_bytes, NET)
    rl = sign_revocations(OPERATOR, NET, 1_700_000_000.123, [NodeKey.generate().peer_id])
    revs.offer(rl)
    obj = orjson.loads(rl.to_json())
    obj["issued_at"] = rl.issued_at + 0.0004
    padded = orjson.dumps(obj)
    hostile = NodeKey.generate().peer_id
    applied: list[RevocationList] = []

    async def fetch(peer: str) -> bytes:
        return padded

    sync = RevocationSync(revs, clock, lambda: [(hostile, (rl.issued_at + 0.0004, rl.digest))],
                          fetch, applied.append)
    assert RevocationList.from_json(padded) == rl  # (the same list: what was signed)
    assert await sync.step() is False
    assert sync.held() == advert_of(rl) and revs.current is rl and applied == []
    assert sync.failed == 1 and sync.candidates() == []  # (the padder is backed off)
    # a node that holds no list takes it, and advertises what it serves
    revs2 = Revocations(OPERATOR.public_bytes, NET)
    sync2 = RevocationSync(revs2, clock, lambda: [(hostile, (rl.issued_at + 0.0004, rl.digest))],
                           fetch, applied.append)
    assert await sync2.step() is True
    served = sync2.answer()
    assert served is not None
    assert sync2.held() == advert_of(RevocationList.from_json(served)) == advert_of(rl)


@pytest.mark.hostile
def test_the_saved_copy_is_not_written_through_a_planted_link(tmp_path: pathlib.Path) -> None:
    """Review 2026-12-02: the copy was written to a fixed temporary name opened with O_CREAT
    and O_TRUNC, following links: whoever could write the state directory (a shared group:
    docs/security.md) planted a link there and the node truncated and overwrote the file it
    pointed to, with the node's rights."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / f".{LEARNT_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    rl = sign_revocations(OPERATOR, NET, 1_700_000_000.0, [NodeKey.generate().peer_id])
    save_list(home, rl)
    assert victim.read_text() == "precious\n"
    assert not (home / LEARNT_FILE).is_symlink()
    revs = Revocations(OPERATOR.public_bytes, NET)
    assert load_saved(home, revs) == rl
    # a link planted at the copy's own name is replaced, not written through
    (home / LEARNT_FILE).unlink()
    (home / LEARNT_FILE).symlink_to(victim)
    save_list(home, rl)
    assert victim.read_text() == "precious\n" and not (home / LEARNT_FILE).is_symlink()


@pytest.mark.hostile
async def test_a_peer_asking_for_the_list_in_a_loop_gets_429s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 2026-12-02, left open (2): any member could ask a node for its list in a loop,
    up to 1 MiB an answer. One answer per peer per 30 s for the same list; honest fetchers
    (each asks once per list) are answered, and a newer list is answered at once."""
    clock = FakeClock()
    revs = Revocations(OPERATOR.public_bytes, NET)
    sync = RevocationSync(revs, clock, list, _no_fetch, lambda rl: None)
    rl = sign_revocations(OPERATOR, NET, clock.wall(), [NodeKey.generate().peer_id])
    assert revs.offer(rl)
    hostile, honest = "hostile-peer", [f"honest-{i}" for i in range(50)]
    first = await sync.handle(_get(hostile))
    assert first.status == 200 and first.body == rl.to_json().encode()
    statuses = Counter[int]()
    for _ in range(1000):
        r = await sync.handle(_get(hostile))
        statuses[r.status] += 1
        assert r.status != 429 or int(dict(r.headers)["retry-after"]) <= ANSWER_INTERVAL_S
        await clock.advance(0.01)  # (ten seconds of asking)
    assert statuses == {429: 1000} and sync.rate_limited == 1000
    for peer in honest:  # meanwhile every honest fetcher gets the list
        r = await sync.handle(_get(peer))
        assert r.status == 200 and r.body == rl.to_json().encode()
    assert (await sync.handle(_get(hostile, "POST"))).status == 405
    # a newer list: the same peer is answered at once (an honest node fetching it in turn)
    newer = sign_revocations(OPERATOR, NET, clock.wall() + 1, [NodeKey.generate().peer_id])
    assert revs.offer(newer)
    r = await sync.handle(_get(honest[0]))
    assert r.status == 200 and r.body == newer.to_json().encode()
    assert (await sync.handle(_get(honest[0]))).status == 429
    await clock.advance(ANSWER_INTERVAL_S)
    assert (await sync.handle(_get(hostile))).status == 200  # one answer per interval
    assert sync.answered == 1 + len(honest) + 2

    # The table of askers is bounded: past it, the peer answered longest ago goes first.
    monkeypatch.setattr(revocations_mod, "MAX_ASKERS", 8)
    sync2 = RevocationSync(revs, clock, list, _no_fetch, lambda rl: None)
    for i in range(20):
        assert (await sync2.handle(_get(f"p{i}"))).status == 200
    assert len(sync2._asked) == 8 and sync2.askers_evicted == 12
    assert (await sync2.handle(_get("p19"))).status == 429
    await clock.advance(ANSWER_INTERVAL_S)
    assert (await sync2.handle(_get("p19"))).status == 200
    assert len(sync2._asked) == 1  # (those answered an interval ago are forgotten)


async def test_a_list_learnt_or_refused_is_logged_with_its_issue_time_in_utc(
        caplog: pytest.LogCaptureFixture) -> None:
    """Both were logged in Unix seconds ("issued at 1700000000.000")."""
    clock = FakeClock()
    revs = Revocations(OPERATOR.public_bytes, NET)
    rl = sign_revocations(OPERATOR, NET, 1_700_000_000.0, [NodeKey.generate().peer_id])
    body = rl.to_json().encode()

    async def fetch(peer: str) -> bytes:
        return body

    caplog.set_level(logging.INFO, "llmfabric.node.revocations")
    sync = RevocationSync(revs, clock, lambda: [("p1", advert_of(rl))], fetch, lambda _: None)
    assert await sync.step() is True
    assert any(r.getMessage().startswith(
        "revocation list issued at 2023-11-14T22:13:20.000Z learnt from peer p1: 1 key(s)")
        for r in caplog.records)
    # a peer advertising a newer list than it serves: refused, saying what it served
    sync = RevocationSync(revs, clock, lambda: [("p2", (rl.issued_at + 1, rl.digest))],
                          fetch, lambda _: None)
    assert await sync.step() is False
    assert any(r.getMessage().endswith(
        "it served a list issued at 2023-11-14T22:13:20.000Z, not newer than ours")
        for r in caplog.records)


async def _no_fetch(peer: str) -> bytes:
    raise AssertionError("no fetch expected")
