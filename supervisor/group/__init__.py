"""Multi-node groups: one daemon per node, node 0's daemon leads (docs/MULTINODE.md).

`report` builds this node's report, `client` asks the other daemons, `leader` keeps their latest
reports and carries out a group incident (capture on every node, stop, launch one rung), `runtime`
is what the owner holds of the group, `view` its part of `/status`. The group's verdict itself is
pure (supervisor.policy.group). The group's other faces sit with their roles: its routes in
api/group.py, its config check in checkconfig/groupcheck.py, its client text in
client/groupformat.py, its bundle text in diagnostics/grouptext.py, its metrics in
metrics/groupfamilies.py, and the owner's group part in daemon/owner_group.py and group/members.py.
"""
