"""Where the scheduler's memory lives and how it spins: the GPU through torch (and cupy for the kernel),
or the host, for checking the harness on a machine without a GPU.

GPU memory comes from plain `torch.empty(..., device="cuda")` (cudaMalloc through torch's caching
allocator), never managed memory, and never more than the caller asked after reading
`torch.cuda.mem_get_info()`.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

# One warp spins on a flag in device memory that nothing ever sets. Bounded twice, so the kernel ends
# by itself even if nothing kills the process: by the global nanosecond timer and, should that timer
# not tick, by the SM cycle counter (cycles at 2 GHz; the H200 boosts to about 1.98 GHz).
SPIN_SOURCE = r"""
extern "C" __global__ void spin_on_flag(const volatile int* flag, unsigned long long bound_ns,
                                        long long bound_cycles, int* seen) {
    unsigned long long t0, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    long long c0 = clock64();
    while (flag[0] == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - t0 >= bound_ns || clock64() - c0 >= bound_cycles) {
            break;
        }
    }
    if (threadIdx.x == 0) {
        seen[blockIdx.x] = flag[0];
    }
}
"""
SPIN_KERNEL = "spin_on_flag"
CYCLES_PER_S = 2.0e9


class Memory(Protocol):
    """The scheduler's view of its device."""

    name: str
    spinner: str  # what `spin` runs: the kernel's name, or "host"
    runtime: str  # versions, for the record

    def init(self) -> None: ...

    def free_bytes(self) -> int: ...

    def alloc(self, nbytes: int, fill: int) -> object: ...

    def warm_up(self, seconds: float) -> None: ...

    def prepare_spin(self, bound_s: float) -> None: ...

    def spin(self) -> None: ...


class CudaMemory:
    name = "cuda"

    def __init__(self) -> None:
        self.spinner = ""
        self.runtime = ""
        self._torch: Any = None
        self._launch: Any = None

    def init(self) -> None:
        import torch  # type: ignore[import-not-found, unused-ignore]

        self._torch = torch
        self.runtime = f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}"
        torch.cuda.set_device(0)
        torch.cuda.init()
        torch.empty(1, device="cuda")  # creates the context now, not inside the timed load

    def free_bytes(self) -> int:
        free, _total = self._torch.cuda.mem_get_info()
        return int(free)

    def alloc(self, nbytes: int, fill: int) -> object:
        torch = self._torch
        buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        buf.fill_(fill & 0xFF)  # touch every byte, as a weight copy would
        torch.cuda.synchronize()
        return buf

    def warm_up(self, seconds: float) -> None:
        torch = self._torch
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for _ in range(20):
                a = torch.tanh(a @ a)
            torch.cuda.synchronize()

    def prepare_spin(self, bound_s: float) -> None:
        """Compile and load the spin kernel now, during warm-up, so nothing is left to do after the onset."""
        bound_ns = int(bound_s * 1e9)
        cycles = int(bound_s * CYCLES_PER_S)
        try:
            import cupy  # type: ignore[import-not-found, unused-ignore]
            import numpy  # type: ignore[import-not-found, unused-ignore]

            kernel = cupy.RawKernel(SPIN_SOURCE, SPIN_KERNEL)
            kernel.compile()
            flag = cupy.zeros(1, dtype=cupy.int32)
            seen = cupy.zeros(1, dtype=cupy.int32)

            def launch() -> None:
                kernel((1,), (32,), (flag, numpy.uint64(bound_ns), numpy.int64(cycles), seen))

            self._launch = launch
            self.spinner = f"{SPIN_KERNEL} (cupy RawKernel)"
        except Exception as err:  # no cupy, or NVRTC failed: torch's own spin kernel, bounded by cycles
            torch = self._torch

            def launch() -> None:
                torch.cuda._sleep(cycles)

            self._launch = launch
            self.spinner = f"torch.cuda._sleep (cupy unavailable: {type(err).__name__})"

    def spin(self) -> None:
        assert self._launch is not None, "prepare_spin first"
        self._launch()
        self._torch.cuda.synchronize()  # the host thread waits in the driver, at 100 % of a core


class HostMemory:
    """No GPU: host buffers and a host spin, so the daemon's path can be checked on a CPU machine."""

    name = "cpu"

    def __init__(self) -> None:
        self.spinner = "host"
        self.runtime = "host memory (no GPU)"
        self._bound_s = 60.0
        self._flag = [0]

    def init(self) -> None:
        pass

    def free_bytes(self) -> int:
        return 2 * 1024**3

    def alloc(self, nbytes: int, fill: int) -> object:
        return bytearray([fill & 0xFF]) * nbytes

    def warm_up(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        x = 0
        while time.monotonic() < until:
            x = (x * 31 + 7) % 1_000_003

    def prepare_spin(self, bound_s: float) -> None:
        self._bound_s = bound_s

    def spin(self) -> None:
        until = time.monotonic() + self._bound_s
        while not self._flag[0] and time.monotonic() < until:
            pass


def memory_for(device: str) -> Memory:
    return CudaMemory() if device == "cuda" else HostMemory()
