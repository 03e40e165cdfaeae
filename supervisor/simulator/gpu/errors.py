"""NVML's error shape and the return codes the simulated GPU raises (pynvml's values)."""

from __future__ import annotations

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_GPU_IS_LOST = 15


class NVMLError(Exception):
    """Shaped like pynvml.NVMLError: `value` is the NVML return code."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value
