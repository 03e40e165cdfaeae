"""Which GPUs belong to this daemon's server: `CUDA_VISIBLE_DEVICES`, read as CUDA reads it.

Several servers on one host (2x TP4 on 8 GPUs, a prefill and a decode server) run one daemon each;
each daemon's GPU gauges, alerts and stall channels must see only its own server's devices, or a
neighbour's memory reads as its own. Pure: parsing and matching, no NVML.

CUDA's rules, followed here: a comma-separated list of indices (`0,1,2,3`) or UUIDs (`GPU-8932f937-...`,
`MIG-...`, a unique prefix is enough); parsing stops at the first entry that is neither, and what
came before it stands; an empty value hides every GPU; unset shows all. Indices are NVML's (the
numbers `nvidia-smi` shows), which are CUDA's under `CUDA_DEVICE_ORDER=PCI_BUS_ID` and on hosts of
one GPU model, the fleet's case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class DeviceScope:
    """`spec` None: every GPU. Otherwise indices and UUID prefixes, in CUDA's order."""

    spec: str | None = None
    indices: frozenset[int] = frozenset()
    uuids: tuple[str, ...] = ()
    ignored: str = ""  # the entries after the first invalid one, which CUDA ignores too

    @classmethod
    def parse(cls, value: str | None) -> DeviceScope:
        if value is None:
            return cls()
        indices: set[int] = set()
        uuids: list[str] = []
        parts = [p.strip() for p in value.split(",")] if value.strip() else []
        for n, part in enumerate(parts):
            if part.isdigit():
                indices.add(int(part))
            elif part.upper().startswith(("GPU-", "MIG-")) and len(part) > 4:
                uuids.append(part.lower())
            else:
                return cls(value, frozenset(indices), tuple(uuids), ",".join(parts[n:]))
        return cls(value, frozenset(indices), tuple(uuids))

    @classmethod
    def for_server(cls, server_env: Mapping[str, str], daemon_env: Mapping[str, str]) -> DeviceScope:
        """The server's `[server] env` wins over the daemon's environment, which the server inherits."""
        if ENV in server_env:
            return cls.parse(server_env[ENV])
        return cls.parse(daemon_env.get(ENV))

    @property
    def everything(self) -> bool:
        return self.spec is None

    def matches(self, index: int, uuid: str) -> bool:
        if self.spec is None:
            return True
        if index in self.indices:
            return True
        u = uuid.lower()
        return bool(u) and any(u.startswith(prefix) for prefix in self.uuids)

    def describe(self) -> str:
        if self.spec is None:
            return "all GPUs"
        text = f"{ENV}={self.spec}"
        return f"{text} (ignoring {self.ignored!r}, as CUDA does)" if self.ignored else text
