"""The EAGLE draft model's CUDA-graph capture, as SGLang structures it: `capture` walks the batch
sizes, `capture_one_batch_size` runs the draft forward under capture and synchronizes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from supervisor.simulator.mirror.torch.cuda.streams import Event, Kernel


class EAGLEDraftCudaGraphRunner:
    def __init__(self, batch_sizes: Sequence[int], launch: Callable[[int], Kernel]) -> None:
        self.capture_bs = tuple(batch_sizes)
        self._launch = launch  # the draft forward: enqueues its kernels on the (fake) GPU
        self.capture()

    def capture(self) -> None:
        for bs in self.capture_bs:
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        kernel = self._launch(bs)
        done = Event()
        done.record(kernel)
        done.synchronize()
