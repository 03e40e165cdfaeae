#!/usr/bin/env bash
# The shipped unit under a real systemd (PID 1 of a podman container built on the image that
# tests/release/image_smoke.sh makes), with the simulator as the server:
#   1. systemd/sglang-supervisor.service (Delegate=yes): the server runs in its own cgroup
#      sglang-server-<marker> below the service's, the journal's `containment` says cgroup_in_use;
#   2. the daemon SIGKILLed: systemd restarts it (Restart=on-failure), KillMode=process leaves the
#      server in its cgroup, and the new daemon adopts it (same pid);
#   3. systemctl stop: exit 0, no survivor;
#   4. the control: the unit with ProtectControlGroups=yes and no Delegate= (main before issue 38):
#      the server shares the daemon's cgroup and `containment` says cgroup_in_use false.
# Not run by CI (no container runtime there). Needs root and podman; PODMAN="podman --runtime runc"
# where crun refuses a hybrid cgroup host. Run tests/release/image_smoke.sh first.
set -euo pipefail
cd "$(dirname "$0")/../.."
PODMAN=${PODMAN:-podman}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' supervisor/__init__.py)
IMAGE=${IMAGE:-localhost/sglang-supervisor:$VERSION-smoke}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sglang-supervisor-systemd-XXXXXX")
NAME=sglang-supervisor-systemd-$$
LIMITS=(--ulimit nofile=8192:8192 --ulimit nproc=1000:1000)
cleanup() { $PODMAN rm -f "$NAME" >/dev/null 2>&1 || true; rm -rf "$WORK"; }
trap cleanup EXIT
fail() { printf 'SYSTEMD SMOKE FAILED: %s\n' "$*" >&2; exit 1; }
in_box() { $PODMAN exec "$NAME" sh -c "$1"; }

cat >"$WORK/Containerfile" <<EOF
FROM $IMAGE
RUN apt-get update && apt-get install -y --no-install-recommends systemd systemd-sysv && rm -rf /var/lib/apt/lists/*
RUN ln -s /opt/sglang-supervisor/venv/bin /opt/sglang-supervisor/bin
ENTRYPOINT []
CMD ["/sbin/init"]
EOF
$PODMAN build --network host "${LIMITS[@]}" -t localhost/sglang-supervisor-systemd "$WORK" >"$WORK/build.log" 2>&1 \
  || { tail -20 "$WORK/build.log"; fail "podman build (systemd in the image)"; }
$PODMAN run -d --name "$NAME" --network host "${LIMITS[@]}" --systemd=always --privileged \
  localhost/sglang-supervisor-systemd >/dev/null
for _ in $(seq 60); do in_box 'systemctl is-system-running' 2>/dev/null | grep -Eq 'running|degraded' && break; sleep 1; done
echo "== systemd $(in_box 'systemctl --version | head -1')"

in_box 'mkdir -p /etc/sglang-supervisor && (umask 077; python3 -c "import secrets; print(secrets.token_hex(16))" >/etc/sglang-supervisor/token)'
$PODMAN exec -i "$NAME" sh -c 'cat >/etc/sglang-supervisor/config.toml' <<'EOF'
[server]
command = ["/opt/sglang-supervisor/venv/bin/python", "-m", "supervisor.simulator"]
host = "127.0.0.1"
port = 39323
[server.env]
SGLANG_SIM_PACE = "0.2"
[server.args]
model-path = "/models/smoke"
tp-size = 2
enable-metrics = true
[api]
host = "127.0.0.1"
port = 39324
token_file = "/etc/sglang-supervisor/token"
EOF

start_unit() {  # start_unit FILE: install it as the service, start it, wait for state=ready
  $PODMAN cp "$1" "$NAME:/etc/systemd/system/sglang-supervisor.service"
  in_box 'rm -rf /var/lib/sglang-supervisor; systemctl daemon-reload && systemctl start sglang-supervisor'
  for _ in $(seq 90); do in_box 'systemctl show -p StatusText --value sglang-supervisor' | grep -q '^state=ready' && return 0; sleep 1; done
  in_box 'journalctl -u sglang-supervisor --no-pager | tail -20'
  fail "not ready within 90 s under $1"
}
containment() { in_box 'grep "\"containment\"" /var/lib/sglang-supervisor/events.jsonl | tail -1'; }
server_pid() { in_box 'systemctl show -p StatusText --value sglang-supervisor' | sed -n 's/.* pid=\([0-9]*\).*/\1/p'; }
cgroup_of() { in_box "sed -n 's/^0:://p' /proc/$1/cgroup"; }

echo "== the shipped unit (Delegate=yes)"
start_unit systemd/sglang-supervisor.service
containment | grep -q '"cgroup_in_use": true' || fail "containment: $(containment)"
pid=$(server_pid)
case $(cgroup_of "$pid") in
  */system.slice/sglang-supervisor.service/sglang-server-*) echo "server pid $pid in $(cgroup_of "$pid")" ;;
  *) fail "server pid $pid is in $(cgroup_of "$pid"), not a launch cgroup below the service" ;;
esac

echo "== the daemon SIGKILLed: restarted by systemd, the server adopted in its cgroup"
main=$(in_box 'systemctl show -p MainPID --value sglang-supervisor')
in_box 'systemctl kill --kill-whom=main --signal=SIGKILL sglang-supervisor'
for _ in $(seq 90); do
  now=$(in_box 'systemctl show -p MainPID --value sglang-supervisor')
  [[ $now != "$main" && $now != 0 ]] && in_box 'systemctl show -p StatusText --value sglang-supervisor' | grep -q '^state=ready' && break
  sleep 1
done
[[ $(server_pid) == "$pid" ]] || fail "the server was not adopted: pid $(server_pid), was $pid"
[[ $(cgroup_of "$pid") == */sglang-server-* ]] || fail "the adopted server left its cgroup"
echo "daemon $main -> $now, server pid $pid adopted, still in its launch cgroup"

echo "== systemctl stop"
in_box 'systemctl stop sglang-supervisor'
[[ $(in_box 'systemctl show -p Result --value sglang-supervisor') == success ]] || fail "stop: not a success"
in_box "test ! -e /proc/$pid" || fail "the server pid $pid survived the stop"
in_box 'journalctl -u sglang-supervisor --no-pager | grep server_stopped | tail -1' | grep -q 'survivors=\[\]' \
  || fail "server_stopped does not say survivors=[]"
echo "stopped, no survivor"

echo "== the control: ProtectControlGroups=yes, no Delegate="
sed -e 's/^Delegate=yes$/ProtectControlGroups=yes/' systemd/sglang-supervisor.service >"$WORK/protected.service"
grep -q '^ProtectControlGroups=yes$' "$WORK/protected.service" || fail "could not make the control unit"
start_unit "$WORK/protected.service"
containment | grep -q '"cgroup_in_use": false' || fail "the control's containment: $(containment)"
containment | grep -q 'Read-only file system' || fail "the control's reason: $(containment)"
pid=$(server_pid)
[[ $(cgroup_of "$pid") == */system.slice/sglang-supervisor.service ]] || fail "control: server in $(cgroup_of "$pid")"
echo "server pid $pid shares the daemon's cgroup; containment: cgroup_in_use false (Read-only file system)"
in_box 'systemctl stop sglang-supervisor'
printf '\nsystemd smoke: every step passed\n'
