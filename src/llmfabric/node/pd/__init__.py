"""Prefill/decode disaggregation on a node and from the PD controller.

Files:
- roles.py: keep the record's prefill/decode roles current after a role flip (the role poll).
- flip.py: the PD controller's signed role flip (/_fabric/v1/role): flip the engine through
  its adapter, republish the roles at once.
- executor.py: lightweight-rescheduling decisions: PeerPDExecutor (role flips over the peer
  protocol, routing plans into the controller's record) and RoleFlipExecutor (engines'
  /sim/role, in-process PD routers).
"""
