"""What NCCL's RAS report says about a hang: pure reading of a RasReport, for the summary and the class.

Only communicators with a rank in this tree count: RAS answers for every NCCL process its network
reaches, and a shared host can run another job's communicators.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from supervisor.diagnostics.capturerecords import Classification
from supervisor.diagnostics.ras import RasComm, RasReport
from supervisor.status.causes import HangClass


@dataclass(frozen=True)
class RasFinding:
    comm: str  # communicator hash
    size: int
    missing: tuple[str, ...]  # "rank 1 pid 42 (unresponsive)"
    missing_ranks: tuple[int, ...]
    behind: tuple[str, ...]  # "rank 1 pid 42: AllReduce 7 of 8"
    operation: str | None  # the collective the others ran and the laggard did not
    errors: tuple[str, ...]  # ranks with an asynchronous NCCL error or an abort


def ours(report: RasReport, tree_pids: Collection[int]) -> tuple[RasComm, ...]:
    """Communicators with at least one rank (present or missing) in the tree."""
    pids = set(tree_pids)
    return tuple(
        c for c in report.communicators if any(r.pid in pids for r in c.ranks) or any(m.pid in pids for m in c.missing)
    )


def _finding(c: RasComm) -> RasFinding | None:
    missing = tuple(
        f"rank {m.rank} pid {m.pid}" + (" (dead)" if m.dead else " (unresponsive)" if m.unresponsive else "")
        for m in c.missing
    )
    most: dict[str, int] = {}
    for r in c.ranks:
        for op, n in r.counts:
            most[op] = max(most.get(op, 0), n)
    behind: list[str] = []
    operation = None
    for r in c.ranks:
        for op, n in r.counts:
            if n < most[op]:
                behind.append(f"rank {r.rank} pid {r.pid}: {op} {n} of {most[op]}")
                operation = operation or op
    errors = tuple(
        f"rank {r.rank} pid {r.pid}: " + ("aborted" if r.abort_flag else f"async error {r.async_error}")
        for r in c.ranks
        if r.abort_flag or r.async_error
    )
    if not (missing or behind or errors):
        return None
    return RasFinding(
        c.hash, c.size, missing, tuple(m.rank for m in c.missing), tuple(behind), operation, errors
    )


def findings(report: RasReport, tree_pids: Collection[int]) -> tuple[RasFinding, ...]:
    return tuple(f for c in ours(report, tree_pids) if (f := _finding(c)) is not None)


def with_ras(cls: Classification, found: tuple[RasFinding, ...]) -> Classification:
    """NCCL's word on a collective outranks our inference from frames: a communicator with a
    missing or lagging rank makes the class `collective` (a CUDA-graph capture still wins: a
    capture that hangs in NCCL is fixed by the capture's fallback rung)."""
    words = [_sentence(f) for f in found if f.missing or f.behind]
    if not words or cls.hang_class == "cuda_graph_capture":
        return cls
    candidates: tuple[HangClass, ...] = ("collective", *(c for c in cls.candidates if c != "collective"))
    return replace(cls, hang_class="collective", reasons=(*words, *cls.reasons), candidates=candidates)


def _sentence(f: RasFinding) -> str:
    parts = []
    if f.missing:
        parts.append(f"missing {', '.join(f.missing)}")
    if f.behind:
        parts.append(f"behind on {f.operation}: {', '.join(f.behind)}")
    return f"NCCL RAS: communicator {f.comm} (size {f.size}): " + "; ".join(parts)


def collective_doc(cls: Classification, found: tuple[RasFinding, ...]) -> dict[str, object]:
    """summary.json `collective`: where the collective class and the missing rank come from."""
    if any(f.missing or f.behind for f in found):
        return {
            "source": "ras",
            "missing_ranks": sorted({r for f in found for r in f.missing_ranks}),
            "operation": next((f.operation for f in found if f.operation), None),
            "text": [_sentence(f) for f in found if f.missing or f.behind],
        }
    if cls.hang_class == "collective":
        return {
            "source": "frames",
            "missing_ranks": None,
            "operation": None,
            "text": [r for r in cls.reasons if "never joined" in r or "collective" in r],
        }
    return {"source": None, "missing_ranks": None, "operation": None, "text": []}


def ras_doc(report: RasReport, tree_pids: Collection[int]) -> dict[str, object]:
    """summary.json `ras`."""
    mine = ours(report, tree_pids)
    found = findings(report, tree_pids)
    return {
        "status": report.status,
        "address": report.address,
        "reason": report.reason,
        "nccl_version": report.nccl_version,
        "duration_s": report.duration_s,
        "communicators": len(mine),
        "other_communicators": len(report.communicators) - len(mine),
        "findings": [
            {
                "comm": f.comm,
                "size": f.size,
                "missing": list(f.missing),
                "behind": list(f.behind),
                "operation": f.operation,
                "errors": list(f.errors),
            }
            for f in found
        ],
    }


def ras_text(doc: dict[str, object], collective: dict[str, object]) -> list[str]:
    status = doc["status"]
    if status == "ok":
        head = (
            f"NCCL RAS ({doc['address']}, NCCL {doc['nccl_version']}): {doc['communicators']} communicator(s)"
            f" of this tree, {doc['duration_s']} s (ras.json)"
        )
    else:
        head = f"NCCL RAS ({doc['address']}): {status}: {doc['reason']}"
    lines = ["", head]
    found = doc.get("findings")
    for f in found if isinstance(found, list) else []:
        if isinstance(f, dict):
            for key in ("missing", "behind", "errors"):
                items = f.get(key)
                if isinstance(items, list) and items:
                    lines.append(f"  communicator {f['comm']}: {key} {', '.join(str(i) for i in items)}")
    if status == "ok" and not found:
        lines.append("  every communicator of the tree has all its ranks, and they agree on their collective counts")
    src = collective.get("source")
    lines.append(f"Collective class and missing rank from: {src or 'neither (no collective seen)'}")
    return lines
