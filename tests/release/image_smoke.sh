#!/usr/bin/env bash
# Build deploy/docker/Dockerfile with podman and run the image: the daemon as the container's
# process launches the simulator, answers /livez and /readyz, passes its self-check (py-spy,
# ptrace, gdb, pystack), and exits 0 on SIGTERM (podman stop).
#
# BASE=docker.io/lmsysorg/sglang:v0.5.16 (the Dockerfile's default) where Docker Hub is reachable.
# Without a registry (this sandbox), BASE=standin builds a stand-in base first: Debian bookworm
# with python3, venv and pip from debootstrap (the host's CA bundle copied in, for a TLS-inspecting
# proxy), which is everything the Dockerfile needs of SGLang's image except SGLang itself.
# Not run by CI (no container builder there, docs/RELEASE.md). Needs root, podman, and for the
# stand-in debootstrap. PODMAN="podman --runtime runc" where crun refuses a hybrid cgroup host.
#   BASE=standin PODMAN="podman --runtime runc" tests/release/image_smoke.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${BASE:-docker.io/lmsysorg/sglang:v0.5.16}
PODMAN=${PODMAN:-podman}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' supervisor/__init__.py)
TAG=localhost/sglang-supervisor:$VERSION-smoke
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sglang-supervisor-image-XXXXXX")
NAME=sglang-supervisor-smoke-$$
# A sandbox may refuse the runtime's default rlimits; these are below any host's.
LIMITS=(--ulimit nofile=8192:8192 --ulimit nproc=1000:1000)
cleanup() {
  $PODMAN rm -f "$NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { printf 'IMAGE SMOKE FAILED: %s\n' "$*" >&2; exit 1; }

# The documented prerequisites (docs/RELEASE.md, "The image"), said before anything is built.
command -v "${PODMAN%% *}" >/dev/null || fail "${PODMAN%% *} is not installed (apt-get install podman buildah)"
if [[ $PODMAN == *"--runtime runc"* ]] && ! command -v runc >/dev/null; then
  fail "PODMAN asks for runc, which is not installed: apt-get install runc (docs/RELEASE.md, \"The image\")"
fi

if [[ $BASE == standin ]]; then
  BASE=localhost/sglang-standin:bookworm
  if ! $PODMAN image exists "$BASE"; then
    echo "== a stand-in base: debootstrap bookworm + python3, venv, pip"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$WORK/rootfs" http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
      || { tail -20 "$WORK/debootstrap.log"; fail "debootstrap"; }
    cp /etc/ssl/certs/ca-certificates.crt "$WORK/rootfs/etc/ssl/certs/ca-certificates.crt"
    rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb
    tar -C "$WORK/rootfs" -c . | $PODMAN import --change 'CMD ["/bin/bash"]' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$BASE" >/dev/null
  fi
fi

echo "== podman build on $BASE"
$PODMAN build --network host "${LIMITS[@]}" --ignorefile deploy/docker/Dockerfile.dockerignore \
  -f deploy/docker/Dockerfile --build-arg "SGLANG_IMAGE=$BASE" -t "$TAG" . >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log"; fail "podman build"; }
grep -E '^STEP|^COMMIT' "$WORK/build.log"

RUN=($PODMAN run --network host "${LIMITS[@]}")
got=$("${RUN[@]}" --rm --entrypoint sglang-supervisor "$TAG" --version)
[[ $got == "sglang-supervisor $VERSION" ]] || fail "--version in the image: $got"
"${RUN[@]}" --rm --entrypoint sh "$TAG" -c \
  'for t in sglang-supervisor py-spy pystack gdb; do command -v "$t" >/dev/null || { echo "no $t"; exit 1; }; done' \
  || fail "a tool is missing on the image's PATH"
"${RUN[@]}" --rm --entrypoint sh "$TAG" -c \
  'ls /opt/sglang-supervisor/venv/lib/python3*/site-packages/sglang_supervisor-*.dist-info/licenses/LICENSE' \
  || fail "the installed package in the image lacks its LICENSE"

echo "== the daemon as the container's process, the simulator as its server"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
SERVER_PORT=$(port)
API_PORT=$(port)
(umask 077; python3 -c 'import secrets; print(secrets.token_hex(16))' >"$WORK/token")
chmod 0400 "$WORK/token"
cat >"$WORK/config.toml" <<EOF
[server]
command = ["/opt/sglang-supervisor/venv/bin/python", "-m", "supervisor.simulator"]
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
token_file = "/run/secrets/sglang-supervisor/token"
EOF
"${RUN[@]}" -d --name "$NAME" --cap-add SYS_PTRACE \
  -v "$WORK/config.toml:/etc/sglang-supervisor/config.toml:ro" \
  -v "$WORK/token:/run/secrets/sglang-supervisor/token:ro" "$TAG" >/dev/null
python3 - "$API_PORT" "$(cat "$WORK/token")" <<'EOF' || { $PODMAN logs "$NAME" 2>&1 | tail -30; fail "the daemon in the container"; }
import json, sys, time, urllib.error, urllib.request
api, token = f"http://127.0.0.1:{sys.argv[1]}", sys.argv[2]
def get(path, auth=False):
    req = urllib.request.Request(api + path, headers={"Authorization": f"Bearer {token}"} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""
deadline = time.monotonic() + 120
while time.monotonic() < deadline and get("/readyz")[0] != 200:
    time.sleep(1)
assert get("/livez")[0] == 200 and get("/readyz")[0] == 200, "not ready within 120 s"
status = json.loads(get("/status", auth=True)[1])
checks = {c["name"]: c["ok"] for c in status["selfcheck"]}
assert status["state"] == "ready", status["state"]
assert all(checks[t] for t in ("py-spy", "ptrace", "gdb", "pystack")), checks
print("ready on rung", status["rung"], "self-check", checks)
EOF
$PODMAN stop -t 120 "$NAME" >/dev/null
code=$($PODMAN inspect "$NAME" --format '{{.State.ExitCode}}')
[[ $code == 0 ]] || { $PODMAN logs "$NAME" 2>&1 | tail -20; fail "exit $code on SIGTERM"; }
echo "stopped by SIGTERM with exit 0"
printf '\nimage smoke: every step passed (%s on %s)\n' "$TAG" "$BASE"
