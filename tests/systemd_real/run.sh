#!/usr/bin/env bash
# `make systemd`: the shipped units under a real systemd, PID 1 of this machine's own namespaces.
#   1. a minimal Debian root file system (mmdebstrap --variant=minbase bookworm, with systemd and
#      python3), built once into $CACHE (about 1-5 minutes from the package registry, 270 MB) and
#      reused while the package list below stays the same;
#   2. the wheel built from this checkout (python -m build), plus its dependencies as wheels;
#   3. systemd booted: `unshare --pid --fork --mount`, the shell moved into cgroups of its own, then
#      `unshare --cgroup`, an overlay on the cached rootfs (the cache is never written), fresh proc,
#      read-only sysfs and /proc/sys (the host's sysctls stay the host's), fresh cgroup mounts rooted
#      at those cgroups, a private /dev, tmpfs /run and /tmp, and `chroot ... /lib/systemd/systemd
#      --system`;
#   4. pytest -m real_systemd tests/systemd_real: the tests install the wheel and the units as
#      systemd/README.md says and drive them with systemctl, journalctl and the CLI through nsenter.
# Whatever happens (a failed test, Ctrl-C, SIGTERM), the EXIT trap powers systemd off, kills what is
# left of its namespace, removes its cgroups and the run's directory; a run killed outright (SIGKILL)
# is cleaned up by the next one. Needs root, unshare and nsenter (util-linux), and mmdebstrap (installed
# here with apt-get when missing). Nothing here skips: a machine that cannot build or boot fails the run.
# Usage: tests/systemd_real/run.sh [PYTEST ARGS...]    (PY=python with pytest and build; CACHE=dir)
#        tests/systemd_real/run.sh --up                  (boot it and wait, to look around; Ctrl-C ends it)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SELF=$HERE/$(basename "$0")
CACHE=${CACHE:-/var/cache/sglang-supervisor-systemd}
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,python3,python3-venv,procps,curl,iproute2
# The rootfs is keyed by what goes into it: a change to the list builds a new one.
KEY=$(printf '%s %s 1\n' "$SUITE" "$PACKAGES" | sha256sum | cut -c1-12)
ROOTFS=$CACHE/rootfs-$SUITE-$KEY
RUNS=$CACHE/runs
# Units that have no business in a test machine sharing the host's kernel and devices.
MASK=(console-getty.service getty.target systemd-sysctl.service systemd-udevd.service
  systemd-udev-trigger.service systemd-modules-load.service systemd-remount-fs.service
  apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer)

say() { printf '== systemd: %s\n' "$*" >&2; }
die() { printf 'MAKE SYSTEMD FAILED: %s\n' "$*" >&2; exit 1; }
alive() { # alive PID: a process that is not a zombie
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# ---- inside the new namespaces ------------------------------------------------------------------
stage1() { # PID 1 of the new pid namespace, still in the host's cgroup namespace: move into the run's cgroups
  local run=$1 dir
  while read -r dir; do echo 0 >"$dir/cgroup.procs"; done <"$run/cgroups"
  exec unshare --cgroup "$SELF" --stage2 "$run" "$2"
}

stage2() { # now the cgroup namespace's root is the run's cgroup: mount the machine and exec systemd
  local run=$1 rootfs=$2 R=$1/root type mp opts n
  mount -t overlay overlay -o "lowerdir=$rootfs,upperdir=$run/upper,workdir=$run/work" "$R"
  mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
  for n in sys sysrq-trigger; do [[ -e $R/proc/$n ]] || continue; mount --bind "$R/proc/$n" "$R/proc/$n"; mount -o remount,bind,ro "$R/proc/$n"; done
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys"
  # The host's cgroup mounts, each mounted afresh: in this namespace their root is the run's cgroup.
  while read -r type mp opts; do
    case $type in
      tmpfs) mount -t tmpfs -o "$opts" tmpfs "$R$mp" ;;
      cgroup | cgroup2) mkdir -p "$R$mp"; mount -t "$type" -o "$opts" "$type" "$R$mp" ;;
    esac
  done <"$run/cgroup-mounts"
  while read -r mp n; do ln -sfn "$n" "$R$mp"; done <"$run/cgroup-links"
  mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
  for n in null zero full random urandom tty; do touch "$R/dev/$n"; mount --bind "/dev/$n" "$R/dev/$n"; done
  mkdir "$R/dev/shm" "$R/dev/pts"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/dev/shm"
  mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts "$R/dev/pts"
  ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
  ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
  mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$R/run"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
  mkdir -p "$R/mnt/share"; mount --bind "$run/share" "$R/mnt/share"
  for n in "${MASK[@]}"; do ln -sfn /dev/null "$R/etc/systemd/system/$n"; done
  cd "$R"
  exec chroot "$R" /usr/bin/env -i container=unshare PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --system --unit=multi-user.target
}

case ${1:-} in
  --stage1) shift; stage1 "$@" ;;
  --stage2) shift; stage2 "$@" ;;
esac

# ---- on the host --------------------------------------------------------------------------------
ensure_tools() {
  [[ $(id -u) == 0 ]] || die "needs root (it boots systemd in namespaces of its own)"
  local t
  for t in unshare nsenter chroot flock setsid; do command -v "$t" >/dev/null || die "no $t on the PATH (util-linux, coreutils)"; done
  if ! command -v mmdebstrap >/dev/null; then
    say "installing mmdebstrap with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq || die "apt-get update failed"
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends mmdebstrap >/dev/null \
      || die "could not install mmdebstrap"
  fi
}

build_rootfs() {
  mkdir -p "$CACHE"
  exec 8>"$CACHE/lock"
  flock 8
  if [[ ! -f $ROOTFS.done ]]; then
    rm -rf "$CACHE"/.build-* "$ROOTFS"
    local tmp=$CACHE/.build-$$ t0=$SECONDS
    say "building the root file system $ROOTFS (mmdebstrap $SUITE; once, then cached)"
    mmdebstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$tmp" </dev/null >"$CACHE/build.log" 2>&1 \
      || { tail -30 "$CACHE/build.log" >&2; die "mmdebstrap failed (log: $CACHE/build.log)"; }
    mv "$tmp" "$ROOTFS"
    touch "$ROOTFS.done"
    say "root file system built in $((SECONDS - t0)) s"
  fi
  flock -u 8
  exec 8>&-
}

# One line per cgroup hierarchy mounted under /sys/fs/cgroup: "TYPE MOUNTPOINT OPTIONS HOSTDIR", where
# HOSTDIR is this process's own cgroup in it (the run's cgroup goes below).
cgroup_hierarchies() {
  awk -v self="$(cat /proc/self/cgroup)" '
    BEGIN { n = split(self, lines, "\n"); for (i = 1; i <= n; i++) { split(lines[i], f, ":"); names[i] = f[2]; paths[i] = substr(lines[i], length(f[1]) + length(f[2]) + 3) } }
    {
      split($0, halves, " - "); split(halves[1], a, " "); split(halves[2], b, " ")
      if (a[5] !~ "^/sys/fs/cgroup") next
      if (b[1] == "tmpfs") { opts = b[3]; sub("^r[ow],?", "", opts); print "tmpfs", a[5], (opts == "" ? "defaults" : opts), "-"; next }
      if (b[1] != "cgroup" && b[1] != "cgroup2") next
      # Mounted again with its controllers (or name=) only: no host flag such as release_agent.
      own = ""; opts = "defaults"
      for (i = 1; i <= n; i++) {
        if (b[1] == "cgroup2") { if (names[i] == "" && lines[i] ~ "^0::") own = paths[i]; continue }
        if (names[i] == "") continue
        m = split(names[i], c, ","); ok = 1
        for (j = 1; j <= m; j++) if (index("," b[3] ",", "," c[j] ",") == 0) ok = 0
        if (ok) { own = paths[i]; opts = names[i] }
      }
      if (own == "") next
      if (a[4] != "/" && index(own, a[4]) == 1) own = substr(own, length(a[4]) + 1)
      print b[1], a[5], opts, a[5] own
    }' /proc/self/mountinfo
}

halt_run() { # halt_run RUN: power the machine off (or kill it), remove its cgroups and directory
  local run=$1 pid1 unshare_pid i dir
  [[ -d $run ]] || return 0
  pid1=$(cat "$run/pid1" 2>/dev/null || true)
  unshare_pid=$(cat "$run/unshare" 2>/dev/null || true)
  if [[ -n $pid1 ]] && alive "$pid1"; then
    say "powering off systemd (pid $pid1)"
    nsenter -t "$pid1" -m -p -r -w /bin/systemctl poweroff --no-block >/dev/null 2>&1 \
      || kill -s SIGRTMIN+4 "$pid1" 2>/dev/null || true
    for ((i = 0; i < 600; i++)); do alive "$pid1" || break; sleep 0.1; done
    if alive "$pid1"; then
      echo "systemd did not power off within 60 s: SIGKILL to its namespace" >&2
      kill -KILL "$pid1" 2>/dev/null || true
      for ((i = 0; i < 100; i++)); do alive "$pid1" || break; sleep 0.1; done
    fi
  fi
  [[ -n $unshare_pid ]] && alive "$unshare_pid" && kill -KILL "$unshare_pid" 2>/dev/null || true
  # Every process of the namespace died with its PID 1; the mounts went with the mount namespace.
  if [[ -f $run/cgroups ]]; then
    while read -r dir; do
      for ((i = 0; i < 50; i++)); do
        [[ -d $dir ]] || break
        find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [[ -d $dir ]] && sleep 0.2
      done
      [[ -d $dir ]] && echo "warning: could not remove the cgroup $dir" >&2
    done <"$run/cgroups"
  fi
  [[ -n $pid1 ]] && alive "$pid1" && { echo "warning: $run left running (pid $pid1)" >&2; return 1; }
  rm -rf "$run"
}

boot() { # boot RUN: start systemd; RUN/pid1 is its pid on the host
  local run=$1 name line type mp opts dir i state n
  mkdir -p "$run/upper" "$run/work" "$run/root" "$run/share"
  echo $$ >"$run/owner"
  name=sglang-supervisor-systemd-$(basename "$run")
  : >"$run/cgroups"; : >"$run/cgroup-mounts"; : >"$run/cgroup-links"
  while read -r type mp opts dir; do
    echo "$type $mp $opts" >>"$run/cgroup-mounts"
    [[ $type == tmpfs ]] && continue
    mkdir "$dir/$name" || die "cannot create a cgroup in $dir (read-only cgroup file system?)"
    for n in cpuset.cpus cpuset.mems; do # a v1 cpuset cgroup starts empty, and nothing may join it then
      [[ -f $dir/$name/$n && -z $(cat "$dir/$name/$n") ]] && cat "$dir/$n" >"$dir/$name/$n"
    done
    echo "$dir/$name" >>"$run/cgroups"
  done < <(cgroup_hierarchies)
  [[ -s $run/cgroups ]] || die "no cgroup hierarchy mounted under /sys/fs/cgroup"
  for line in /sys/fs/cgroup/*; do [[ -L $line ]] && echo "$line $(readlink "$line")" >>"$run/cgroup-links"; done
  setsid unshare --pid --fork --mount --propagation private "$SELF" --stage1 "$run" "$ROOTFS" \
    </dev/null >"$run/boot.log" 2>&1 &
  echo $! >"$run/unshare"
  for ((i = 0; i < 100; i++)); do
    line=$(cat "/proc/$!/task/$!/children" 2>/dev/null || true)
    [[ -n ${line// /} ]] && break
    alive $! || { cat "$run/boot.log" >&2; die "unshare exited at once: the boot failed (its output above)"; }
    sleep 0.1
  done
  pid1=${line%% *}
  [[ -n $pid1 ]] || die "no PID 1 under unshare $!"
  echo "$pid1" >"$run/pid1"
  for ((i = 0; i < 1200; i++)); do
    alive "$pid1" || { cat "$run/boot.log" >&2; die "systemd exited while booting"; }
    state=$(nsenter -t "$pid1" -m -p -r -w /bin/systemctl is-system-running 2>/dev/null || true)
    [[ $state == running || $state == degraded ]] && break
    sleep 0.1
  done
  [[ $state == running || $state == degraded ]] || { cat "$run/boot.log" >&2; die "systemd not up after 120 s: '$state'"; }
  if [[ $state == degraded ]]; then
    nsenter -t "$pid1" -m -p -r -w /bin/systemctl --failed --no-pager >&2 || true
  fi
  say "systemd $(nsenter -t "$pid1" -m -p -r -w /bin/systemctl --version | head -1 | cut -d' ' -f2) is PID 1 of pid $pid1: $state"
}

clean_stale() { # runs whose owner died without its trap (SIGKILL)
  local run owner
  for run in "$RUNS"/*; do
    [[ -d $run ]] || continue
    owner=$(cat "$run/owner" 2>/dev/null || true)
    [[ -n $owner ]] && alive "$owner" && continue
    say "cleaning up a stale run $run"
    halt_run "$run" || true
  done
}

fetch_wheels() { # fetch_wheels PY RUN: the wheel's dependencies, as wheels for the rootfs's python
  local py=$1 run=$2 target host arch m plats=()
  target=$(basename "$(ls -d "$ROOTFS"/usr/lib/python3.[0-9]* | sort -V | tail -1)") # python3.11
  host=$("$py" -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
  if [[ $target == "$host" ]]; then
    "$py" -m pip wheel -q --wheel-dir "$run/share/wheels" "$run"/share/dist/*.whl >"$run/wheels.log" 2>&1 \
      || { tail -30 "$run/wheels.log" >&2; die "pip wheel (the dependencies) failed"; }
    return
  fi
  # Another python here: binary wheels for the rootfs's CPython on bookworm's glibc (2.36).
  arch=$(uname -m)
  for m in $(seq 5 36); do plats+=(--platform "manylinux_2_${m}_$arch"); done
  plats+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
  "$py" -m pip download -q --only-binary=:all: --implementation cp --python-version "${target#python}" \
    "${plats[@]}" --dest "$run/share/wheels" "$run"/share/dist/*.whl >"$run/wheels.log" 2>&1 \
    || { tail -30 "$run/wheels.log" >&2; die "pip download (the dependencies for $target) failed"; }
}

PYTEST= RUN=
stop_pytest() {
  [[ -n $PYTEST ]] || return 0
  kill -TERM "$PYTEST" 2>/dev/null || true
  wait "$PYTEST" 2>/dev/null || true
}

main() {
  local t0=$SECONDS root py rc
  root=$(cd "$HERE/../.." && pwd)
  py=${PY:-$root/.venv/bin/python}
  ensure_tools
  mkdir -p "$RUNS"
  clean_stale
  build_rootfs
  RUN=$(mktemp -d "$RUNS/XXXXXX")
  local run=$RUN
  trap 'halt_run "$RUN"' EXIT
  trap 'stop_pytest; exit 130' INT
  trap 'stop_pytest; exit 143' TERM
  say "building the wheel"
  "$py" -m build --wheel --outdir "$run/share/dist" "$root" >"$run/build.log" 2>&1 \
    || { tail -30 "$run/build.log" >&2; die "python -m build failed"; }
  fetch_wheels "$py" "$run"
  cp -r "$root/systemd" "$run/share/systemd"
  boot "$run"
  if [[ ${1:-} == --up ]]; then # a machine to look at: nsenter -t PID1 -m -p -r -w bash; Ctrl-C ends it
    say "up: nsenter -t $(cat "$run/pid1") -m -p -r -w /bin/bash (share: $run/share); Ctrl-C powers it off"
    while :; do sleep 3600 & wait $!; done # wait, not sleep: the traps run at once
  fi
  # In the background with a wait, so that a SIGTERM to this script runs its traps at once; the
  # TERM trap ends pytest first.
  SGLANG_SUPERVISOR_SYSTEMD_PID1=$(cat "$run/pid1") SGLANG_SUPERVISOR_SYSTEMD_SHARE=$run/share \
    "$py" -m pytest -q -n 0 -p no:cacheprovider --real-systemd -m real_systemd \
    "$root/tests/systemd_real" "$@" &
  PYTEST=$!
  rc=0
  wait $PYTEST || rc=$?
  PYTEST=
  say "pytest exit $rc; $((SECONDS - t0)) s in all"
  return $rc
}
main "$@"
