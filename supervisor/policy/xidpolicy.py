"""What an Xid means for the server: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors),
as pure data and one pure decision.

Two kinds matter to a supervisor. An application fault (an illegal address, a kernel exception)
kills the CUDA context that hit it; the GPU is fine and a relaunch is the fix, as for any rank
that died. A fault that leaves the GPU unusable until it is reset (or the node drained) makes every
relaunch onto that GPU fail the same way, and costs a model load each time: the daemon stops,
says `failed` and names the GPU, and an operator resets it (the alert says so).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from probes.xid import XidEvent

XidAction = Literal["restart", "reset_gpu"]

# xid -> (what NVIDIA's catalogue says, what the GPU needs)
CATALOGUE: dict[int, tuple[str, XidAction]] = {
    13: ("graphics engine exception (an illegal instruction or address in a kernel)", "restart"),
    31: ("GPU memory page fault (an illegal memory access by the application)", "restart"),
    32: ("invalid or corrupted push buffer stream", "restart"),
    43: ("GPU stopped processing (the application hit a fault and was stopped)", "restart"),
    45: ("preemptive cleanup, due to a previous error", "restart"),
    48: ("double-bit ECC error (DBE)", "reset_gpu"),
    61: ("internal micro-controller breakpoint/warning", "reset_gpu"),
    62: ("internal micro-controller halt", "reset_gpu"),
    63: ("ECC page retirement or row remapping recorded", "restart"),
    64: ("ECC page retirement or row remapper recording failure", "reset_gpu"),
    68: ("NVDEC0 exception", "restart"),
    69: ("graphics engine class error", "restart"),
    74: ("NVLink error", "reset_gpu"),
    79: ("GPU has fallen off the bus", "reset_gpu"),
    92: ("high single-bit ECC error rate", "restart"),
    94: ("contained ECC error (the application that hit it must restart)", "restart"),
    95: ("uncontained ECC error", "reset_gpu"),
    109: ("context switch timeout", "restart"),
    119: ("GSP RPC timeout", "reset_gpu"),
    120: ("GSP error", "reset_gpu"),
    121: ("C2C link error", "reset_gpu"),
    140: ("unrecovered ECC error", "reset_gpu"),
    154: ("GPU recovery action changed (reset or drain required)", "reset_gpu"),
}


def xid_action(xid: int) -> XidAction:
    """Unknown Xids restart as today: the daemon never takes a GPU out of service on a guess."""
    return CATALOGUE.get(xid, ("", "restart"))[1]


def xid_meaning(xid: int) -> str:
    return CATALOGUE.get(xid, ("not in the daemon's catalogue: see NVIDIA's Xid table", "restart"))[0]


def describe(e: XidEvent) -> str:
    uuid = f" ({e.uuid})" if e.uuid else ""
    return f"Xid {e.xid} on GPU {e.gpu}{uuid}: {xid_meaning(e.xid)}"


def blocking(events: Sequence[XidEvent], server_gpus: Collection[int] | None) -> XidEvent | None:
    """The first event that leaves one of the server's GPUs unusable until reset; `server_gpus`
    None: the server's GPUs are not known, so every GPU counts (a server uses the node's GPUs)."""
    for e in events:
        if xid_action(e.xid) == "reset_gpu" and (server_gpus is None or e.gpu in server_gpus or e.gpu < 0):
            return e
    return None
