"""The `sglang-supervisor` command: run, demo, check-config, and client commands to a running daemon."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor import __version__
from supervisor.common import sigmask
from supervisor.common.configerror import ConfigError
from supervisor.common.exitcodes import EXIT_BROKEN_PIPE, EXIT_CONFIG, EXIT_HANDOFF, EXIT_LOCKED
from supervisor.config.settings import load_settings

if TYPE_CHECKING:
    from supervisor.host.inherit import Handover


def _run(args: argparse.Namespace) -> int:
    from supervisor.common import ownpackage
    from supervisor.host import inherit
    from supervisor.host.instance_lock import StateDirLocked, StateDirUnusable
    from supervisor.logs import setup as logsetup
    from supervisor.root.serve import serve

    # First: what a handoff's previous image passed on leaves the environment before anything can
    # be spawned with it (a preflight's own variable included).
    inherited = inherit.take(os.environ, os.getpid()) if not args.preflight else inherit.Inherited()
    shadowed = ownpackage.check()  # before anything else: another program's `supervisor` package
    if shadowed is not None:
        print(f"sglang-supervisor: refused to start: {shadowed}", file=sys.stderr)
        return EXIT_CONFIG
    if args.preflight:
        return _preflight(args.config)
    logsetup.configure(json=args.log_json, level=args.log_level)
    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        print(f"sglang-supervisor: config refused:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    handover: list[inherit.Handover] = []
    try:
        code = asyncio.run(
            serve(
                settings,
                env=dict(os.environ),
                config_path=Path(args.config),
                inherited=inherited,
                handover=handover,
            )
        )
    except ConfigError as err:
        print(f"sglang-supervisor: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except StateDirLocked as err:
        print(f"sglang-supervisor: refused: {err}", file=sys.stderr)
        return EXIT_LOCKED
    except StateDirUnusable as err:
        print(f"sglang-supervisor: {err}", file=sys.stderr)
        return EXIT_CONFIG
    return reexec(handover[0] if handover else None) if code == EXIT_HANDOFF else code


def _preflight(config: str) -> int:
    """`run --preflight`: validate what a start would, start nothing (the SIGUSR2 handoff asks)."""
    from supervisor.root.preflight import check

    try:
        check(config, os.environ)
    except ConfigError as err:
        print(f"sglang-supervisor: config refused:\n{err}", file=sys.stderr)
        return EXIT_CONFIG
    from supervisor.host.inherit import TAKES_OVER

    print(f"sglang-supervisor {__version__}: {config} would start; a handoff to it {TAKES_OVER}")
    return 0


def reexec(handover: Handover | None = None) -> int:
    """The SIGUSR2 handoff's second half: run the (upgraded) code on disk in this very process.

    Same pid, so systemd sees no exit and no start (a handoff spends none of the unit's start
    limit, which is there for crash loops). What `handover` keeps open crosses the exec: the API's
    listening socket and the locked state directory (supervisor.host.inherit), so no other process
    can bind the port or take the state directory between the two images. Signals stay blocked
    across the exec (pending ones included) until the new loop's handlers run. Only if the exec
    itself fails does the daemon exit 75 (EX_TEMPFAIL) for systemd to start it
    (RestartForceExitStatus=75); the kept descriptors close with it.
    """
    from supervisor.host.inherit import exec_env

    sigmask.hold()
    sys.stdout.flush()
    sys.stderr.flush()
    if handover is not None:
        os.environ.update(exec_env(handover, os.getpid()))
    try:
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    except OSError as err:
        why = f"handoff re-exec failed ({err}); exiting {EXIT_HANDOFF} for a restart"
        print(f"sglang-supervisor: {why}", file=sys.stderr)
    return EXIT_HANDOFF


def _check_config(args: argparse.Namespace) -> int:
    from supervisor.checkconfig.argcheck import check_rungs, check_rungs_json

    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        if args.json:
            print(json.dumps({"ok": False, "refused": str(err)}, indent=2))
        else:
            print(f"config refused:\n{err}", file=sys.stderr)
        return 1
    check = check_rungs_json if args.json else check_rungs
    code = check(settings, validate=not args.no_sglang, out=sys.stdout, strict=args.strict)
    if args.group:  # the running leader's answer to this node's config (docs/MULTINODE.md)
        from supervisor.checkconfig.groupcheck import ask_leader

        agrees, line = ask_leader(settings)
        print(line, file=sys.stdout if agrees else sys.stderr)
        code = code or (0 if agrees else 1)
    return code


def _group_key(args: argparse.Namespace) -> int:
    from supervisor.checkconfig.groupcheck import node_key_hex

    try:
        print(node_key_hex(load_settings(args.config), args.node))
    except ConfigError as err:
        print(f"sglang-supervisor: {err}", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from supervisor.demo import run_demo

    return run_demo(
        duration=args.duration,
        state_dir=args.state_dir,
        keep=args.keep,
        until_recovered=args.until_recovered,
        cross_engine=args.cross_engine,
    )


def _completion(args: argparse.Namespace) -> int:
    from supervisor.client.completion import script

    print(script(build_parser(), args.shell), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from supervisor.client.verbs import add_client_commands

    p = argparse.ArgumentParser(
        prog="sglang-supervisor",
        description="Supervise an SGLang server: detect silent deadlocks, keep the evidence, fall back and restart.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the daemon in the foreground (what systemd runs)")
    run.add_argument("--config", required=True, help="TOML config file (docs/CONFIGURATION.md)")
    run.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    run.add_argument(
        "--log-json",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="JSON log lines (default: console format on a terminal and under systemd, where each line "
        "also carries its syslog priority for journalctl -p; JSON otherwise)",
    )
    run.add_argument(
        "--preflight",
        action="store_true",
        help="validate the config, the API token and the notification secrets as a start would, start "
        "nothing, exit 0 or 2 (what a SIGUSR2 handoff runs before the old daemon lets go)",
    )
    run.set_defaults(func=_run)

    demo = sub.add_parser("demo", help="watch the built-in SGLang simulator deadlock, get diagnosed and fall back")
    demo.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    demo.add_argument("--state-dir", default=None, help="where to keep logs and bundles (default: a temp dir)")
    demo.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the temporary state dir (logs, evidence, event journal) at the end (default; --no-keep deletes it)",
    )
    demo.add_argument(
        "--until-recovered",
        action="store_true",
        help="end by itself once the server serves on the fallback rung (what `make demo` runs)",
    )
    demo.add_argument(
        "--cross-engine",
        action="store_true",
        help="a ladder that crosses engines: SGLang EAGLE-3, SGLang without CUDA graphs, then vLLM (docs/ENGINES.md)",
    )
    demo.set_defaults(func=_demo)

    chk = sub.add_parser("check-config", help="validate a config and print each rung's command line")
    chk.add_argument("--config", required=True)
    chk.add_argument("--no-sglang", action="store_true", help="skip checking rung arguments with SGLang's parser")
    chk.add_argument("--strict", action="store_true", help="warnings fail the check too (exit 1)")
    chk.add_argument("--json", action="store_true", help="print the result as one JSON document")
    chk.add_argument(
        "--group", action="store_true", help="also ask the group's running leader whether this node's config may join"
    )
    chk.set_defaults(func=_check_config)

    gk = sub.add_parser(
        "group-key",
        help="print node N's group key (a worker's [group] key_file) from the leader's secret_file",
    )
    gk.add_argument("--config", required=True, help="a config whose [group] secret_file holds the group secret")
    gk.add_argument("--node", required=True, type=int, help="the node_rank whose key to print (1..nnodes-1)")
    gk.set_defaults(func=_group_key)

    add_client_commands(sub)

    comp = sub.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description="print a completion script: source <(sglang-supervisor completion bash)",
    )
    comp.add_argument("shell", choices=["bash", "zsh"])
    comp.set_defaults(func=_completion)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "run":  # only the daemon's loop takes over the signals sigmask.hold() kept pending
        sigmask.release()
    from supervisor.client.verbs import COMMANDS, run_client

    try:
        if args.command in COMMANDS:
            return int(run_client(args))
        return int(args.func(args))
    except BrokenPipeError:
        if args.command == "run":
            raise  # the daemon's own stdout is not a pipe a reader closes: that is a real fault
        return _reader_gone()


def _reader_gone() -> int:
    """stdout's reader has gone (`| head`): stop quietly. What is still buffered for it would fail
    again at exit, so stdout is pointed at /dev/null first (the Python docs' recipe for SIGPIPE)."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
