"""A stand-in for SGLang on one real GPU, and the harness that runs the daemon against it.

`server` is the supervised program (`python -m bench.gpuserver.server`, SGLang's command line);
`scheduler` is its one child, titled `sglang::scheduler_TP0`, which holds the GPU memory and, by
mode (env `GPU_SERVER_MODE`), serves, deadlocks on two locks, or spins a GPU kernel on a flag that
is never set. `harness` runs the daemon in-process against it and measures what happened;
`bench.gpu_bench` and `tests/gpu/` both use it. Nothing here is imported by the daemon.
"""
