#!/usr/bin/env bash
# The release smoke test: build the sdist and the wheel with `python -m build`, install the WHEEL
# (not editable) into a fresh virtual environment, and run the installed package the way a user
# does, from a directory that holds no source, so nothing can come from the checkout:
#   1. the wheel holds every tracked module of supervisor/, api/, probes/ and the LICENSE;
#   2. `sglang-supervisor --version` is the source's version, and so is the installed metadata;
#   3. `check-config` on systemd/config.example.toml names the keys that cannot work here (exit 1,
#      no traceback), and accepts a config that runs the simulator (exit 0, "config OK");
#   4. the simulator's entry point (`python -m supervisor.simulator`) serves /health and /generate;
#   5. a daemon (`sglang-supervisor run`) answers /livez, launches the simulator, is ready on
#      /readyz, `status` exits 0 with a token, and SIGTERM stops it (exit 0, the server port free);
#   6. `sglang-supervisor demo --until-recovered --no-keep` tells its story to the end and leaves
#      nothing in its temporary directory.
# Called by .ci/run after `make test`; about 1-2 minutes on 2 cores. Usage:
#   tests/release/smoke.sh                 # build with .venv/bin/python (make venv), test the wheel
#   WHEEL=dist/x.whl tests/release/smoke.sh  # test a wheel built elsewhere (skips the build)
# Exit 0 when every step passed; otherwise the failing step's name and output, exit 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sglang-supervisor-smoke-XXXXXX")
PIDS=()

cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    # Each background step runs in its own process group (setsid): end the whole group.
    kill -TERM -- "-$pid" 2>/dev/null || true
  done
  sleep 1
  for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

step() { printf '\n== smoke: %s\n' "$*"; }
fail() { printf 'SMOKE FAILED: %s\n' "$*" >&2; exit 1; }
# Background a command in its own session (so cleanup can end its whole tree); its pid is $!.
spawn() { setsid "$@" & PIDS+=("$!"); }

# ---------------------------------------------------------------------------------------------
step "build the sdist and the wheel (python -m build)"
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' supervisor/__init__.py)
[[ -n $VERSION ]] || fail "no __version__ in supervisor/__init__.py"
if [[ -z ${WHEEL:-} ]]; then
  "$PY" -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; fail "python -m build"; }
  WHEEL=$WORK/dist/sglang_supervisor-$VERSION-py3-none-any.whl
  SDIST=$WORK/dist/sglang_supervisor-$VERSION.tar.gz
  [[ -f $SDIST ]] || fail "no sdist $SDIST (ls: $(ls "$WORK/dist"))"
  tar -tzf "$SDIST" >"$WORK/sdist.txt"
  for need in LICENSE CHANGELOG.md README.md pyproject.toml supervisor/__init__.py; do
    grep -qx "sglang_supervisor-$VERSION/$need" "$WORK/sdist.txt" || fail "the sdist lacks $need"
  done
fi
[[ -f $WHEEL ]] || fail "no wheel $WHEEL for version $VERSION"
echo "built $(basename "$WHEEL")"

step "the wheel holds every tracked module and the LICENSE"
git ls-files supervisor api probes >"$WORK/tracked.txt" 2>/dev/null \
  || (find supervisor api probes -type f ! -name '*.pyc' ! -path '*/__pycache__/*' | sort >"$WORK/tracked.txt")
python3 - "$WHEEL" "$WORK/tracked.txt" "$VERSION" <<'EOF'
import sys, zipfile
wheel, tracked, version = sys.argv[1:]
names = set(zipfile.ZipFile(wheel).namelist())
missing = [p for p in open(tracked).read().split() if p not in names]
info = f"sglang_supervisor-{version}.dist-info"
for need in (f"{info}/licenses/LICENSE", f"{info}/entry_points.txt", "supervisor/py.typed"):
    if need not in names:
        missing.append(need)
if any(n.startswith("tests/") for n in names):
    missing.append("(tests/ must not ship)")
if missing:
    sys.exit("the wheel lacks: " + ", ".join(missing))
print(f"{len(names)} files, none missing")
EOF

step "install the wheel into a fresh virtual environment (not editable)"
python3 -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
BIN=$WORK/venv/bin
"$VPY" -m pip install -q "$WHEEL" >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log"; fail "pip install the wheel"; }
# From here on: run from an empty directory, with no PYTHONPATH, so only the install can answer.
mkdir "$WORK/cwd"
cd "$WORK/cwd"
unset PYTHONPATH
where=$("$VPY" -c 'import supervisor, api, probes; print(supervisor.__file__, api.__file__, probes.__file__)')
case $where in
  *"$ROOT"*) fail "imported from the checkout: $where" ;;
esac
[[ $where == "$WORK/venv/"* ]] || fail "not imported from the fresh venv: $where"
"$VPY" -m pip show sglang-supervisor >"$WORK/show.txt"
grep -q "^Location: $WORK/venv" "$WORK/show.txt" || { cat "$WORK/show.txt"; fail "pip show: not installed in the venv"; }
if grep -qi "editable project location" "$WORK/show.txt"; then fail "an editable install"; fi
echo "imported from $WORK/venv"

step "--version"
got=$("$BIN/sglang-supervisor" --version)
[[ $got == "sglang-supervisor $VERSION" ]] || fail "--version printed '$got', expected 'sglang-supervisor $VERSION'"
meta=$("$VPY" -c 'import importlib.metadata as m; print(m.version("sglang-supervisor"))')
[[ $meta == "$VERSION" ]] || fail "installed metadata says $meta, the source $VERSION"
echo "$got"

step "check-config on the example config names what cannot work here"
rc=0
"$BIN/sglang-supervisor" check-config --config "$ROOT/systemd/config.example.toml" >"$WORK/check.out" 2>&1 || rc=$?
tail -5 "$WORK/check.out"
if [[ $rc -ne 1 ]] || ! grep -q '^error: server.command' "$WORK/check.out" || ! grep -q 'config NOT OK' "$WORK/check.out" \
  || grep -q Traceback "$WORK/check.out"; then
  fail "check-config on the example: exit $rc, expected 1 naming server.command without a traceback"
fi

free_port() { "$VPY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# wait_http URL CODE SECONDS [TOKEN]: poll until URL answers CODE (an integer), or fail.
wait_http() {
  "$VPY" - "$@" <<'EOF' || fail "$1 did not answer $2 within $3 s"
import sys, time, urllib.error, urllib.request
url, code, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
token = sys.argv[4] if len(sys.argv) > 4 else None
deadline, last = time.monotonic() + seconds, "no answer"
while time.monotonic() < deadline:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            got, body = r.status, r.read(200)
    except urllib.error.HTTPError as e:
        got, body = e.code, e.read(200)
    except OSError as e:
        got, body = None, str(e).encode()
    if got == code:
        print(f"{url}: {got}")
        sys.exit(0)
    last = f"{got} {body[:120]!r}"
    time.sleep(0.5)
print(f"{url}: last answer {last}", file=sys.stderr)
sys.exit(1)
EOF
}

step "the simulator's entry point (python -m supervisor.simulator) serves"
SIM_PORT=$(free_port)
SGLANG_SIM_PACE=0.2 spawn "$VPY" -m supervisor.simulator --model-path /models/smoke --tp-size 2 \
  --host 127.0.0.1 --port "$SIM_PORT" --enable-metrics >"$WORK/sim.log" 2>&1
SIM_PID=$!
wait_http "http://127.0.0.1:$SIM_PORT/health" 200 90 || { tail -20 "$WORK/sim.log"; exit 1; }
"$VPY" - "$SIM_PORT" <<'EOF' || fail "the simulator's /generate"
import json, sys, urllib.request
body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 8}}).encode()
with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/generate", body, timeout=30) as r:
    answer = json.load(r)
assert answer.get("text"), answer
print("generate:", repr(answer["text"][:40]))
EOF
kill -TERM "$SIM_PID"
for _ in $(seq 60); do kill -0 "$SIM_PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$SIM_PID" 2>/dev/null && fail "the simulator did not end on SIGTERM within 30 s"
echo "ended on SIGTERM"

step "a daemon run: /livez, the simulator launched, /readyz, status, SIGTERM"
SERVER_PORT=$(free_port)
API_PORT=$(free_port)
(umask 077; "$VPY" -c 'import secrets; print(secrets.token_hex(16))' >"$WORK/token")
TOKEN=$(cat "$WORK/token")
cat >"$WORK/smoke.toml" <<EOF
[server]
command = ["$VPY", "-m", "supervisor.simulator"]
host = "127.0.0.1"
port = $SERVER_PORT
[server.env]
SGLANG_SIM_PACE = "0.2"
[server.args]
model-path = "/models/smoke"
tp-size = 2
enable-metrics = true

[api]
host = "127.0.0.1"
port = $API_PORT
token_file = "$WORK/token"

[paths]
state_dir = "$WORK/state"
EOF
"$BIN/sglang-supervisor" check-config --config "$WORK/smoke.toml" >"$WORK/check2.out" 2>&1 \
  || { cat "$WORK/check2.out"; fail "check-config refused the simulator's config"; }
grep -q "config OK" "$WORK/check2.out" || { cat "$WORK/check2.out"; fail "check-config did not say config OK"; }
echo "check-config: config OK"
spawn "$BIN/sglang-supervisor" run --config "$WORK/smoke.toml" >"$WORK/daemon.log" 2>&1
DAEMON_PID=$!
wait_http "http://127.0.0.1:$API_PORT/livez" 200 60 || { tail -30 "$WORK/daemon.log"; exit 1; }
wait_http "http://127.0.0.1:$API_PORT/status" 401 10   # the token is required
wait_http "http://127.0.0.1:$API_PORT/readyz" 200 120 || { tail -30 "$WORK/daemon.log"; exit 1; }
wait_http "http://127.0.0.1:$SERVER_PORT/health" 200 10
"$BIN/sglang-supervisor" status --config "$WORK/smoke.toml" >"$WORK/status.out" 2>&1 \
  || { cat "$WORK/status.out"; fail "status exited non-zero with the server ready"; }
grep -q "ready" "$WORK/status.out" || { cat "$WORK/status.out"; fail "status does not say ready"; }
head -3 "$WORK/status.out"
kill -TERM "$DAEMON_PID"
rc=0
for _ in $(seq 180); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.5; done
kill -0 "$DAEMON_PID" 2>/dev/null && fail "the daemon did not exit within 90 s of SIGTERM"
wait "$DAEMON_PID" || rc=$?
[[ $rc -eq 0 ]] || { tail -30 "$WORK/daemon.log"; fail "the daemon exited $rc on SIGTERM"; }
"$VPY" - "$SERVER_PORT" <<'EOF' || fail "the server port is still held after the daemon's stop"
import socket, sys
with socket.socket() as s:  # SO_REUSEADDR as a server binds: only a listener holds the port, not TIME_WAIT
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
EOF
grep -q Traceback "$WORK/daemon.log" && { cat "$WORK/daemon.log"; fail "a traceback in the daemon's log"; }
echo "stopped with exit 0, server port free"

step "the demo to its end (--until-recovered --no-keep), leaving nothing behind"
mkdir "$WORK/demo-tmp"
rc=0
TMPDIR=$WORK/demo-tmp timeout 240 "$BIN/sglang-supervisor" demo --until-recovered --duration 200 --no-keep \
  >"$WORK/demo.out" 2>&1 || rc=$?
tail -4 "$WORK/demo.out"
[[ $rc -eq 0 ]] || { cat "$WORK/demo.out"; fail "the demo exited $rc"; }
grep -q "^final: state=stopped rung=no-cuda-graph" "$WORK/demo.out" || fail "the demo did not end on the fallback rung"
grep -q "^last incident: .* cause=startup_stall" "$WORK/demo.out" || fail "the demo's incident was not startup_stall"
left=$(ls -A "$WORK/demo-tmp")
[[ -z $left ]] || fail "the demo left in its temporary directory: $left"
grep -q Traceback "$WORK/demo.out" && fail "a traceback in the demo's output"

printf '\nsmoke: every step passed (sglang-supervisor %s, wheel %s)\n' "$VERSION" "$(basename "$WHEEL")"
