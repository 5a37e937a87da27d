#!/usr/bin/env bash
# The docker sandbox's machine side, offline: Debian's docker.io and debootstrap, a daemon
# started with no bridge and no iptables rules (containers run with --network none, so it
# never needs either, and never touches a private-range address), and the local base image
# the bundled tasks' Dockerfiles start FROM, built with debootstrap from Debian's package
# registry and `docker import` (no image is ever pulled). Safe to run again: each step is
# skipped when done. Sourced by scripts/bootstrap.sh or run alone; it never fails the
# caller: when something cannot be done it says why, and the docker tests skip saying so.
#
#   HARNESSRL_DOCKER=0        skip all of it
#   HARNESSRL_BASE_IMAGE      the base image's name (default harnessrl/base:bookworm)
HARNESSRL_BASE_IMAGE="${HARNESSRL_BASE_IMAGE:-harnessrl/base:bookworm}"
export HARNESSRL_BASE_IMAGE

_hrl_docker_cache="${HARNESSRL_CACHE:-$HOME/.cache/harnessrl}/docker"
# What the base image holds beyond minbase: python3 (tasks' solutions call it; its
# libraries are those the mounted harness runtimes need too) and ca-certificates.
_hrl_base_packages="python3,ca-certificates"

_hrl_docker_say() { echo "docker.sh: $*" >&2; }

_hrl_docker_install() {
  command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || { _hrl_docker_say "no apt-get to install docker.io"; return 1; }
  local sudo=""
  [ "$(id -u)" -ne 0 ] && { command -v sudo >/dev/null 2>&1 && sudo="sudo -n" || return 1; }
  local apt="$sudo env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=300"
  _hrl_docker_say "installing docker.io and debootstrap"
  $apt install -y docker.io debootstrap >/dev/null 2>&1 \
    || { $apt update >/dev/null 2>&1 && $apt install -y docker.io debootstrap >/dev/null 2>&1; }
}

_hrl_docker_daemon() {
  docker info >/dev/null 2>&1 && return 0
  [ "$(id -u)" -eq 0 ] || { _hrl_docker_say "no daemon answers and dockerd needs root"; return 1; }
  mkdir -p "$_hrl_docker_cache"
  _hrl_docker_say "starting dockerd --bridge=none --iptables=false (log: $_hrl_docker_cache/dockerd.log)"
  # setsid: the daemon outlives this shell (later test runs reuse it) and its signals.
  # It gets none of this shell's other open files: an inherited lock (`flock ... bash
  # scripts/test.sh`) or pipe would stay held for as long as the daemon lives.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [ "$fd" -gt 2 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec setsid dockerd --bridge=none --iptables=false --ip6tables=false --ip-forward=false \
      --ip-masq=false --userland-proxy=false --pidfile "$_hrl_docker_cache/dockerd.pid" \
      >"$_hrl_docker_cache/dockerd.log" 2>&1 </dev/null
  ) &
  local i
  for i in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  _hrl_docker_say "dockerd did not answer within 30 s: $(tail -n 3 "$_hrl_docker_cache/dockerd.log")"
  return 1
}

_hrl_docker_mirror() {
  # The machine's own apt source for Debian (deb822 or one-line format), so debootstrap
  # uses the registry apt already uses.
  local uri
  uri="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' \
         | grep -v security | head -n 1)"
  [ -n "$uri" ] || uri="$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                          | awk '{print $2}' | grep -v security | head -n 1)"
  echo "$uri"
}

_hrl_docker_base() {
  docker image inspect "$HARNESSRL_BASE_IMAGE" >/dev/null 2>&1 && return 0
  local tarball="$_hrl_docker_cache/rootfs-bookworm-${_hrl_base_packages//,/-}.tar"
  if [ ! -s "$tarball" ]; then
    local rootfs mirror
    rootfs="$(mktemp -d /tmp/hrl-rootfs-XXXXXX)"
    mirror="$(_hrl_docker_mirror)"
    _hrl_docker_say "debootstrap bookworm ($_hrl_base_packages) for $HARNESSRL_BASE_IMAGE (~2 min, once)"
    if ! debootstrap --variant=minbase --include="$_hrl_base_packages" bookworm "$rootfs" \
        $mirror >"$_hrl_docker_cache/debootstrap.log" 2>&1; then
      _hrl_docker_say "debootstrap failed: $(tail -n 3 "$_hrl_docker_cache/debootstrap.log")"
      rm -rf "$rootfs"
      return 1
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$rootfs"
  fi
  docker import --change 'CMD ["/bin/bash"]' "$tarball" "$HARNESSRL_BASE_IMAGE" >/dev/null
}

hrl_docker_setup() {
  [ "${HARNESSRL_DOCKER:-1}" = "0" ] && return 0
  _hrl_docker_install || { _hrl_docker_say "could not install docker.io; docker tests will skip"; return 0; }
  _hrl_docker_daemon || { _hrl_docker_say "no Docker daemon; docker tests will skip"; return 0; }
  _hrl_docker_base || { _hrl_docker_say "no base image; docker tests will skip"; return 0; }
}

# Run alone (not sourced): do it now.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  hrl_docker_setup
fi
