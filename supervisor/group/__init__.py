"""Multi-node groups: one daemon per node, node 0's daemon leads (docs/MULTINODE.md). One package.

`peers` is the protocol the owner meets the group by (`NoPeers` on one node); `members` holds its two
sides, a worker's `GroupPeers` and node 0's `LeaderPeers` (given the owner's record and heartbeat
once, `attach`); `verdict` is the group's pure verdict; `report` builds this node's report, `client`
asks the other daemons, `leader` keeps their latest reports and carries out a group incident
(capture on every node, stop, launch one rung), `joining` admits a member, `signing` and
`credentials` prove who asks, `runtime` is what a daemon holds of its group, `view` its part of
`/status`. The group's faces in other layers sit with their roles: its routes in api/group.py, its
config check in checkconfig/groupcheck.py, its client text in client/groupformat.py, its bundle
text in diagnostics/grouptext.py, its metric families in metrics/groupfamilies.py.
"""
