"""`[gpu]`: where the daemon reads GPU state from. The real NVML (pynvml) in production; the
simulator's GPU (a JSON file, supervisor/simulator/gpu) for the demo, the tests and benchmarks on
machines without a GPU. Chosen here, explicitly, and nowhere else: no environment variable switches it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, model_validator


class GpuSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    source: Literal["nvml", "simulator"] = "nvml"
    file: str | None = None  # the simulated GPU's JSON file; only with source = "simulator"

    @model_validator(mode="after")
    def _file_with_simulator(self) -> GpuSettings:
        if self.source == "simulator" and not (self.file or "").strip():
            raise ValueError(
                'source = "simulator" reads a JSON file: set [gpu] file to its path '
                "(the simulator writes to the file its SGLANG_SIM_GPU_FILE names)"
            )
        if self.source == "nvml" and self.file is not None:
            raise ValueError('file is read only with source = "simulator"; remove it, or set source = "simulator"')
        return self

    @property
    def simulated(self) -> bool:
        return self.source == "simulator"

    def describe(self) -> str:
        """One line for check-config, the self-check and the journal."""
        if self.source == "simulator":
            return f"the simulator's GPU from {self.file} ([gpu] source = \"simulator\"), not a real NVML"
        return "NVML (pynvml)"
