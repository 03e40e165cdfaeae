"""Module trees named like torch's, triton's and SGLang's, so that py-spy shows the simulator's busy
phases in the frames it shows for the real server: a spin in `Event.synchronize
(.../torch/cuda/streams.py)` under `EAGLEDraftCudaGraphRunner.capture_one_shape
(.../sglang/srt/speculative/eagle_draft_cuda_graph_runner.py)`, a compilation in `compile
(.../triton/compiler/compiler.py)` under `compile_fx_inner (.../torch/_inductor/compile_fx.py)`.
The code here really runs those frames (a Python loop that spins, a loop that computes); nothing
prints a hint. Imported as `supervisor.simulator.mirror.*`, never as top-level `torch`, so nothing
else on the machine can pick it up by mistake.
"""
