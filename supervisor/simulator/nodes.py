"""Which ranks a node runs, and where the group meets: SGLang 0.5.16's multi-node arithmetic.

`engine.py:_calculate_rank_ranges`: each of `--nnodes` nodes runs `tp_size // nnodes` schedulers,
node R the global TP ranks `[R * per_node, (R + 1) * per_node)`; titles and log tags use the global
rank (`sglang::scheduler_TP1` on node 1 of a tp-2, two-node group). Every rank of every node meets
at `--dist-init-addr` (`distributed/bootstrap.py:_resolve_dist_init_method`: `tcp://HOST:PORT`),
where global rank 0 hosts torch's TCPStore; without the flag the address is the node's own host and
a random port, which no other node can find.
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.simulator.argv import SimArgs

# torch's default process-group timeout for NCCL (`default_pg_nccl_timeout`, 10 minutes): what
# `--dist-timeout` (SGLang's `dist_timeout`, default None) leaves in force for the rendezvous.
TORCH_NCCL_DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class NodeLayout:
    tp_size: int
    nnodes: int
    node_rank: int
    dist_init_addr: str | None
    dist_timeout: int | None

    @property
    def multinode(self) -> bool:
        """Ranks meet at the rendezvous (a node rank beyond the group fails there, as in torch)."""
        return self.nnodes > 1 or self.node_rank != 0

    @property
    def per_node(self) -> int:
        return max(1, self.tp_size // self.nnodes)

    @property
    def local_ranks(self) -> range:
        """The global TP ranks this node runs, lowest first."""
        return range(self.per_node * self.node_rank, self.per_node * (self.node_rank + 1))

    @property
    def first_local(self) -> int:
        return self.local_ranks.start

    @property
    def timeout_s(self) -> float:
        return float(self.dist_timeout) if self.dist_timeout else TORCH_NCCL_DEFAULT_TIMEOUT_S

    def victim(self) -> int:
        """The rank a per-node fault hits: the node's second rank, or its only one (TP1 / TP0 on one node)."""
        ranks = self.local_ranks
        return ranks[1] if len(ranks) > 1 else ranks[0]


def node_layout(args: SimArgs) -> NodeLayout:
    return NodeLayout(args.tp_size, max(1, args.nnodes), args.node_rank, args.dist_init_addr, args.dist_timeout)


def layout_error(layout: NodeLayout) -> str | None:
    """SGLang's `check_server_args` assertion, or None when the layout is one SGLang accepts."""
    if layout.tp_size % layout.nnodes != 0:
        return "tp_size must be divisible by number of nodes"
    return None


def split_addr(addr: str) -> tuple[str, int] | None:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port); None when it is not one (SGLang's NetworkAddress.parse)."""
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    value = int(port)
    return (host, value) if 0 < value < 65536 else None
