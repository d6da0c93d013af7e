"""The encrypted, mutually authenticated data plane between an ingress and a provider.

An ingress and a provider agree on a session key once per pair (an X25519 exchange signed
by both node keys, carried over the peer network, relays included: a relay sees only public
values and signatures it cannot forge). Every forwarded request then carries a short-lived
authorization (HMAC of the session key over request id, expiry, path and body); the provider
refuses unknown sessions, expired or far-future expiries, bad MACs and replays (bounded
cache). Ed25519 per request (~130 us sign + ~300 us verify here) would not fit the 0.3 ms
budget; HMAC-SHA256 costs ~4 us per KiB.

Files:
- exchange.py: `offer`/`answer`/`finish`, the signed session-key exchange; `SessionKey`.
- authz.py: `authorize` (ingress side: the `X-Fabric-Auth` value), `ProviderSessions`
  (provider side: sessions, `verify`, `open_sealed`) and `ReplayCache`.
- sealing.py: AES-GCM sealing of relayed request bodies and response frames (`Sealer`,
  `FrameOpener`): end-to-end inside the peer stream, so relays can neither read nor alter.
- control.py: Ed25519-signed control requests (assign/release) from the controller.
"""
