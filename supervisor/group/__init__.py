"""Multi-node groups: one daemon per node, node 0's daemon leads (docs/MULTINODE.md).

`report` builds this node's report, `client` asks the other daemons, `leader` keeps their latest
reports and carries out a group incident (capture on every node, stop, launch one rung), `member`
is what a worker holds for the leader. The group's verdict itself is pure: supervisor.policy.group.
"""
