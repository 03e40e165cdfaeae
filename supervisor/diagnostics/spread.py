"""How close together the ranks of a tree were sampled: frames from different ranks compare only
if they were read at nearly the same instant. Every process's tools start at once (one task each);
this measures what that achieved, from the moment each process's first stack tool started."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def sample_spread(starts: Mapping[int, float], ranks: Sequence[int]) -> dict[str, object]:
    """summary.json `sampling`: `rank_spread_s` between the first and the last rank's first sample
    (None with fewer than two ranks sampled), and each process's offset from the first sample."""
    if not starts:
        return {"rank_spread_s": None, "ranks_sampled": 0, "spread_s": None, "offsets_s": {}, "frozen": False}
    first = min(starts.values())
    sampled = [starts[pid] for pid in ranks if pid in starts]
    return {
        "rank_spread_s": round(max(sampled) - min(sampled), 4) if len(sampled) >= 2 else None,
        "ranks_sampled": len(sampled),
        "spread_s": round(max(starts.values()) - first, 4),  # every process of the tree
        "offsets_s": {str(pid): round(at - first, 4) for pid, at in sorted(starts.items())},
        "frozen": False,  # the cgroup freezer is not used: docs/DECISIONS.md "All ranks at one instant"
    }


def spread_text(doc: Mapping[str, object]) -> str:
    spread = doc.get("rank_spread_s")
    n = doc.get("ranks_sampled")
    if spread is None:
        return f"Sampling: {n} rank(s) sampled; all processes within {doc.get('spread_s')} s of each other"
    return f"Sampling: {n} ranks sampled within {float(str(spread)):.3f} s of each other (first to last rank)"
