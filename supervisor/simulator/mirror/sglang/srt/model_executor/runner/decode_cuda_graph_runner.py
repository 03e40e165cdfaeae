"""SGLang 0.5.16's decode CUDA-graph runner, as far as its frames go: `capture` walks the batch sizes
(largest first) and captures each with `capture_one_shape`, which subclasses define."""

from __future__ import annotations

from collections.abc import Sequence


class DecodeCudaGraphRunner:
    def __init__(self, batch_sizes: Sequence[int]) -> None:
        self.capture_bs = tuple(sorted(batch_sizes, reverse=True))

    def capture(self) -> None:
        for bs in self.capture_bs:
            self.capture_one_shape(bs)

    def capture_one_shape(self, size: int) -> None:
        raise NotImplementedError
