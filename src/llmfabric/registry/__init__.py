"""The CRDT registry: a G-Map from session id to signed owner records plus third-party facts.

Files:
- records.py: NodeRecord / NodeMeta / ServedModel / Lifecycle (the value model).
- signing.py: `Signer` protocol (NodeKey satisfies it), Ed25519 verify, peer-id derivation
  (delegated to llmfabric.identity), session ids bound to the owner's key.
- codec.py: canonical msgpack record bodies, `sign_record`, verified decoding, `SignedRecord`.
- cache_sketch.py: the prefix-cache summary a record carries (`NodeMeta.prefix_cache`): a
  bounded Bloom filter of prefix-block keys, `build_sketch`, `matched_blocks`, validation.
- facts.py: SUSPECT / EVICT facts signed by their author (`make_fact`, `verify_fact`).
- entry.py: `Entry` (one session's state) and `merge`, the semilattice join; an eviction
  needs EVICT facts from a quorum of distinct authors (`decisive_evict`).
- owner.py: `RecordOwner`, the only writer of a session's record (versions, incarnations).
- fit.py: `fit_meta`: an owner's record kept under the body limit by shedding optional
  items (sketch, demand, spend, grants, PD plan), least needed first; `RecordTooLarge`.
- replica.py: `Replica` (verified ingestion, change listeners, bucketed digests, GC);
  `freeze()` / `adopt()` share one converged state between many simulated replicas.
- cow.py: `CowDict`, `CowSet`: copy-on-write maps and sets over a shared read-only base
  (what an adopted replica stores; real nodes keep plain dicts).
- guard.py: `TrustConfig` (eviction quorum, per-author fact rate limit, sessions per peer),
  `RecordPolicy`, `AuthorLimiter`: what a replica refuses from hostile members.
- provider.py: `ProviderVerifier` (verified provider identity of a record: membership
  certificate or key fingerprint), `CertRecordPolicy`.
- views.py: `NodeRegistry`, `ModelRegistry`, `NodeView` answered from the local replica.
- errors.py: RegistryError > InvalidRecord (with a drop `reason`), NotOwner.
See docs/registry.md for merge rules, facts and GC bounds.
"""
