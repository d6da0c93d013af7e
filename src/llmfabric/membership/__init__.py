"""SWIM failure detection with Lifeguard: probes, 3 indirect probe paths, suspicion,
refutation (by the agent, with a higher incarnation) and eviction.

Files:
- swim.py: `Prober` (randomised round-robin probes, indirect probes via PING_REQ, ack relay).
- memberset.py: `Member`, `MemberSet` (O(1) changes and random picks, stable slots for the
  prober's rounds, forks sharing one base in simulations).
- suspicion.py: `SuspicionTracker`, Lifeguard timeouts shrinking with confirmations.
- health.py: `LocalHealth`, Lifeguard's local health multiplier.
- messages.py: the SWIM messages `Ping`, `Ack`, `PingReq` and `WireItem` (gossip.wire encodes
  them in its envelope).
- params.py: `ProbeParams`, `SuspicionParams`: what SWIM reads of the configuration
  (gossip.config.GossipConfig satisfies them; membership never imports gossip).
The agent that runs them over a Transport is llmfabric.gossip.agent.GossipAgent.
"""
