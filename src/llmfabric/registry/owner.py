"""The owner side of one session: mint the session id, and sign every new version of its record.

`RecordOwner` is the only writer of its session's record. Every change bumps `version`;
refuting a suspicion bumps `incarnation`; the lifecycle only moves forward (JOIN -> SERVING ->
DOWN -> LEFT; DOWN -> SERVING is not allowed: a node that recovers rejoins with a new session).
"""

from __future__ import annotations

import dataclasses

from llmfabric.registry.codec import (
    MAX_BODY_BYTES,
    MAX_NAMES,
    SignedRecord,
    encode_body,
    name_count,
    sign_record,
)
from llmfabric.registry.errors import RegistryError
from llmfabric.registry.fit import RecordTooLarge, fit_meta
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord
from llmfabric.registry.signing import Signer, new_session_id
from llmfabric.untrusted import get_logger

MAX_INCARNATION = 2**63 - 1  # the largest incarnation codec.py and facts.py decode
log = get_logger(__name__)


class LifecycleError(RegistryError):
    """The lifecycle only moves forward; start a new session to serve again after DOWN/LEFT."""


class RecordOwner:
    def __init__(
        self, signer: Signer, meta: NodeMeta, *, wall: float, session_id: str | None = None
    ) -> None:
        self._signer = signer
        self._shed: tuple[str, ...] = ()
        sid = session_id or new_session_id(signer.public_bytes)
        rec = NodeRecord(
            session_id=sid, peer_id=signer.peer_id, public_key=signer.public_bytes,
            state=Lifecycle.JOIN, incarnation=0, version=0, updated_at=wall, meta=meta,
        )
        self._current = sign_record(signer, self._fitted(rec))

    @property
    def signer(self) -> Signer:
        return self._signer

    @property
    def session_id(self) -> str:
        return self._current.session_id

    @property
    def current(self) -> SignedRecord:
        return self._current

    @property
    def record(self) -> NodeRecord:
        return self._current.record

    def _write(self, wall: float, **changes: object) -> SignedRecord:
        rec = dataclasses.replace(
            self._current.record, version=self._current.record.version + 1,
            updated_at=wall, signature=b"", **changes,  # type: ignore[arg-type]
        )
        self._current = sign_record(self._signer, self._fitted(rec))
        return self._current

    def _fitted(self, rec: NodeRecord) -> NodeRecord:
        """`rec` within the body limit every replica enforces (registry/fit.py): optional
        items shed when together they are too large (RecordTooLarge when that is not enough,
        or when its models answer to more names than every replica accepts)."""
        names = name_count(rec.meta.models)
        if names > MAX_NAMES:
            raise RecordTooLarge(f"the models answer to {names} names (ids, aliases, LoRA "
                                 f"adapters and base:adapter pairs); replicas accept at most "
                                 f"{MAX_NAMES} per record: serve fewer adapters or aliases")
        meta, shed = fit_meta(
            rec.meta, lambda m: len(encode_body(dataclasses.replace(rec, meta=m))),
            MAX_BODY_BYTES)
        if shed != self._shed:  # (logged when what is shed changes, not per version)
            self._shed = shed
            if shed:
                log.warning("session %s: the record is over the %d-byte limit with all its "
                            "items; left out or shortened: %s", rec.session_id,
                            MAX_BODY_BYTES, ", ".join(shed))
        return rec if not shed else dataclasses.replace(rec, meta=meta)

    def update_meta(self, meta: NodeMeta, *, wall: float) -> SignedRecord:
        return self._write(wall, meta=meta)

    def set_state(self, state: Lifecycle, *, wall: float) -> SignedRecord:
        cur = self._current.record.state
        if state < cur:
            raise LifecycleError(
                f"session {self.session_id} is {cur.name}; it cannot go back to {state.name} "
                "(start a new session instead)"
            )
        return self._write(wall, state=state)

    def refute(self, suspected_incarnation: int, *, wall: float) -> SignedRecord:
        """Publish an incarnation above `suspected_incarnation` (no-op if already above)."""
        # Replicas refuse facts above our incarnation + 1 (registry.guard), so this grows by
        # at most 2 per refutation; the clamp keeps it inside what every decoder accepts.
        inc = min(MAX_INCARNATION,
                  max(self._current.record.incarnation, suspected_incarnation + 1))
        return self._write(wall, incarnation=inc)

    def refresh(self, *, wall: float) -> SignedRecord:
        """Re-sign with a new version and timestamp so the record never ages out."""
        return self._write(wall)
