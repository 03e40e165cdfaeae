"""vLLM 0.26.0's CUDA-graph capture in the V2 model runner (`vllm/v1/worker/gpu/cudagraph_utils.py:295-330`):
`capture` walks the batch descriptors, warms each up and captures it; a forward whose kernel never
ends leaves the host thread in the synchronize that follows the launch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from supervisor.simulator.mirror.torch.cuda.streams import Event, Kernel


class CudaGraphManager:
    def __init__(self, sizes: Sequence[int], launch: Callable[[int], Kernel]) -> None:
        self._sizes = tuple(sizes)
        self._launch = launch

    def capture(self) -> None:
        for size in self._sizes:
            self._capture_one(size)

    def _capture_one(self, size: int) -> None:
        done = Event()
        done.record(self._launch(size))
        done.synchronize()
