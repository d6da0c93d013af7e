"""The fleet controller's executors: they carry the scheduler's decisions out on the nodes.

The decisions themselves are data (scheduler/decisions.py), taken by the controller loops of
scheduler/ (scheduler/controller.py, scheduler/phasesplit/controller.py); `llmfabric
controller` (cli/controller.py, cli/controller_pd.py) wires a loop to one of these. Both send
signed control requests over the peer protocol, whose wire types the node defines
(node/serve/peer_api.py), so this layer sits above node/ and below cli/.

Files:
- executor.py: `PeerExecutor` (Assign and Release: signed assignments and releases POSTed to
  each node, a round's requests concurrent, each with its own timeout) and
  `post_signed_control` (one signed control request, its answer bounded in time and size).
- pd_executor.py: lightweight-rescheduling decisions: `PeerPDExecutor` (role flips over the
  peer protocol, routing plans into the controller's record) and `RoleFlipExecutor`
  (engines' /sim/role, in-process PD routers).
"""
