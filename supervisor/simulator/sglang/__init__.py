"""The simulated SGLang server (`python -m supervisor.simulator`, or `--engine sglang`): its main
process and HTTP front, the schedulers and the detokenizer, their start-up, serving loop, faults and
tracebacks, and the worker nodes of a multi-node group. Shared parts sit in `supervisor.simulator`.
"""
