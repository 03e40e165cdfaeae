"""What every process of a simulated vLLM tree knows: the command line, the scenario, the figures."""

from __future__ import annotations

import os
from dataclasses import dataclass

from supervisor.simulator.nodes import NodeLayout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import SimSettings
from supervisor.simulator.vllm.argv import VllmArgs
from supervisor.simulator.vllm.facts import VllmFacts


@dataclass(frozen=True)
class VllmContext:
    args: VllmArgs
    settings: SimSettings
    facts: VllmFacts
    main_pid: int  # the `vllm serve` process the supervisor launched (the onset file's pid)

    def onset(self, onset: bool = True) -> None:
        s = self.settings
        write_onset(s.onset_file, s.scenario.value, s.requested.value, self.main_pid, self.args.unknown_flags, onset)

    def layout(self) -> NodeLayout:
        """The group as SGLang's multi-node arithmetic sees it (nodes.py): vLLM's world is TP x PP, split
        evenly over `--nnodes`; the ranks meet at `--master-addr:--master-port` (torch's TCPStore)."""
        a = self.args
        return NodeLayout(a.world_size, a.nnodes, a.node_rank, f"{a.master_addr}:{a.master_port}", None)

    def env_float(self, name: str, default: float) -> float:
        """One of vLLM's own variables (envs.py), read as vLLM reads it."""
        raw = os.environ.get(name, "").strip()
        try:
            return float(raw) if raw else default
        except ValueError:
            return default
