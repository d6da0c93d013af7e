"""Prefill/decode disaggregation on a node.

Files:
- roles.py: keep the record's prefill/decode roles current after a role flip (the role poll).
- flip.py: the PD controller's signed role flip (/_fabric/v1/role): flip the engine through
  its adapter, republish the roles at once.
"""
