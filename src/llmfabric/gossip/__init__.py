"""Dissemination of registry deltas: rumours piggybacked on SWIM and pushed to a fanout, plus
push-pull anti-entropy; and `GossipAgent`, the object a node process runs.

Files:
- agent.py: `GossipAgent` (start/aclose, update_self/set_state/leave, views, listeners,
  on_evicted, stats): wires replica + dissemination + anti-entropy + SWIM to a Transport.
- members.py: `AgentMembers`, the sessions the agent probes and gossips with (followed per
  replica change in O(1); `purge_peer` for a revoked member) and the evicted sessions whose
  peers it reconnects to (`reconnect_candidates`).
- changes.py: what a replica change means to the agent: `is_minor` (a load-hint refresh,
  sent `minor_transmits` times), `membership_changed`, `evicted` (a reconnect candidate).
- config.py: `GossipConfig`, presets `local`/`lan`/`wan` (`preset(name)`), Lifeguard formulas.
- wire.py: versioned msgpack envelope, `MsgKind` (append-only), validated `decode`.
- broadcast.py: `BroadcastQueue`, transmit-limited queue of fresh changes.
- antientropy.py: `AntiEntropy`, root hash -> bucket hashes -> digests -> deltas.
- stats.py: `AgentStats` counters (messages, bytes, drops and rejections by reason).
- rebootstrap.py: `Rebootstrapper`, dials the bootstrap addresses again (backoff) while the
  node is cut off from the fabric (no live member, or no live seed).
"""
