"""The owner side of one session: mint the session id, and sign every new version of its record.

`RecordOwner` is the only writer of its session's record. Every change bumps `version`;
refuting a suspicion bumps `incarnation`; the lifecycle only moves forward (JOIN -> SERVING ->
DOWN -> LEFT; DOWN -> SERVING is not allowed: a node that recovers rejoins with a new session).
"""

from __future__ import annotations

import dataclasses

from llmfabric.registry.codec import SignedRecord, sign_record
from llmfabric.registry.errors import RegistryError
from llmfabric.registry.records import Lifecycle, NodeMeta, NodeRecord
from llmfabric.registry.signing import Signer, new_session_id

MAX_INCARNATION = 2**63 - 1  # the largest incarnation codec.py and facts.py decode


class LifecycleError(RegistryError):
    """The lifecycle only moves forward; start a new session to serve again after DOWN/LEFT."""


class RecordOwner:
    def __init__(
        self, signer: Signer, meta: NodeMeta, *, wall: float, session_id: str | None = None
    ) -> None:
        self._signer = signer
        sid = session_id or new_session_id(signer.public_bytes)
        rec = NodeRecord(
            session_id=sid, peer_id=signer.peer_id, public_key=signer.public_bytes,
            state=Lifecycle.JOIN, incarnation=0, version=0, updated_at=wall, meta=meta,
        )
        self._current = sign_record(signer, rec)

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
        self._current = sign_record(self._signer, rec)
        return self._current

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
