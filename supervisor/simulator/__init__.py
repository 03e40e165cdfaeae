"""A stand-in for an SGLang server (`python -m sglang.launch_server ...`) for tests and the demo.

`python -m supervisor.simulator --model-path X --tp-size N --host H --port P ...` prints SGLang's
start-up lines and progress bars, spawns `sglang::scheduler_TPn` and `sglang::detokenizer` child
processes, binds the port only once every scheduler is ready, serves SGLang's endpoints, and fails
in the ways real deployments fail when `SGLANG_SIM_SCENARIO` asks it to. See docs/SIMULATOR.md.
"""
