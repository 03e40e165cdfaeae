"""The simulated vLLM server (`python -m supervisor.simulator --engine vllm`): the API server, the
engine core, the executor and its workers, their log lines, tracebacks and metrics. Shared parts sit
in `supervisor.simulator`.
"""
