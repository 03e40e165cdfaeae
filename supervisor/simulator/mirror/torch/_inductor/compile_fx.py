"""torch._inductor.compile_fx's shape: a graph's kernels are generated and compiled one by one."""

from __future__ import annotations

from supervisor.simulator.mirror.triton.compiler import compiler


def compile_fx_inner(graph: str, kernels: int, seconds: float) -> list[str]:
    return [compiler.compile(f"{graph}:triton_kernel_{i}", seconds / kernels) for i in range(kernels)]
