"""`python -m supervisor.simulator`: the simulator's entry point.

`--engine vllm` first on the command line speaks vLLM (`vllm serve`'s arguments follow); `--engine sglang`
or no `--engine` speaks SGLang. Spawned children re-import this module as `__mp_main__`, so it imports
nothing at module level.
"""

from __future__ import annotations

import sys


def _engine(argv: list[str]) -> tuple[str, list[str]]:
    """The leading `--engine NAME` (or `--engine=NAME`), and the rest of the command line."""
    if argv[:1] == ["--engine"] and len(argv) > 1:
        return argv[1], argv[2:]
    if argv[:1] and argv[0].startswith("--engine="):
        return argv[0].split("=", 1)[1], argv[1:]
    return "sglang", argv


def _main() -> int:
    engine, argv = _engine(sys.argv[1:])
    if engine == "vllm":
        from supervisor.simulator.vllm.server import main as vllm_main

        return vllm_main(argv)
    if engine != "sglang":
        print(f"simulator: --engine {engine!r} is unknown; use sglang or vllm", file=sys.stderr)
        return 2
    from supervisor.simulator.sglang.server import main

    return main(argv)


if __name__ == "__main__":
    sys.exit(_main())
