"""NCCL's RAS client, for the capture: the protocol lives in probes/ras.py (the detector polls it
too, issue 35); this module keeps the names the diagnostics package has always used."""

from __future__ import annotations

from probes.ras import (
    DEFAULT_ADDR,
    RasComm,
    RasMissing,
    RasRank,
    RasReport,
    RasStatus,
    parse_status,
    query_ras,
    ras_address,
)

__all__ = [
    "DEFAULT_ADDR",
    "RasComm",
    "RasMissing",
    "RasRank",
    "RasReport",
    "RasStatus",
    "parse_status",
    "query_ras",
    "ras_address",
]
