"""The EAGLE draft model's CUDA-graph capture, structured as SGLang 0.5.16's
(`sglang/srt/speculative/eagle_draft_cuda_graph_runner.py`): the inherited `capture` walks the batch
sizes, `capture_one_shape` runs the draft forward and waits for the GPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from supervisor.simulator.mirror.sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
    DecodeCudaGraphRunner,
)
from supervisor.simulator.mirror.torch.cuda.streams import Event, Kernel


class EAGLEDraftCudaGraphRunner(DecodeCudaGraphRunner):
    def __init__(self, batch_sizes: Sequence[int], launch: Callable[[int], Kernel]) -> None:
        super().__init__(batch_sizes)
        self._launch = launch  # the draft forward: enqueues its kernels on the (fake) GPU
        self.capture()

    def capture_one_shape(self, size: int) -> None:
        kernel = self._launch(size)
        done = Event()
        done.record(kernel)
        done.synchronize()
