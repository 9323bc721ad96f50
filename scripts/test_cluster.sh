#!/usr/bin/env bash
# A cluster of hosts on this one machine, for rehearsing and testing multi-node jobs: each host is a
# network namespace plus a UTS namespace (its own interfaces, address and hostname) on a Linux bridge,
# with its own sshd; the file system is the machine's. See docs/cluster.md.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/test_cluster.sh VERB [ARGS...]      (as root)

A cluster of hosts dlrm-node1..dlrm-nodeN on this machine, each a network and UTS namespace
(`hostname` says dlrm-nodeK) with its own address on a bridge and its own sshd; every host and
the machine reach every host by name over ssh, without prompts. The hosts share the machine's
file system, so the repository and its venv are the same paths everywhere.

Verbs:
  up N            make hosts dlrm-node1..dlrm-nodeN (1..200); a second `up N` changes nothing;
                  state a crashed run left behind is removed first
  down            remove everything `up` made: processes on the hosts, namespaces, links, the
                  bridge, the /etc/hosts block, the ssh client settings, the state folder
  status          hosts, addresses, link state, rate limits, sshd (exit 1 when no cluster is up)
  run NODE CMD..  run CMD inside NODE (its namespaces, this environment and folder); CMD's exit code
  cut NODE        take NODE's link down (the host stays, unreachable)
  heal NODE       bring NODE's link back up
  slow NODE MBIT  limit NODE's link to MBIT Mbit/s in both directions (tc tbf); 0 lifts the limit

Network: the bridge `dlrm0` holds .1 of the subnet (the machine as the hosts see it, named
dlrm-head), host K holds .(10+K) on its own interface, also named `dlrm0` (so launchers that pick
an interface by name, like `horovodrun --network-interfaces dlrm0`, find the same one on every
host and on the machine). The hosts have no route beyond the subnet.

Names: a marked block in /etc/hosts (shared by every host); ssh settings for dlrm-node* in
/etc/ssh/ssh_config.d/dlrm-cluster.conf (the cluster's key pair and known_hosts, user root).

Environment:
  DLRM_CLUSTER_SUBNET   the cluster's /24 (default 10.213.57.0/24); `up` refuses one in use
  DLRM_CLUSTER_PATH     PATH that ssh sessions on the hosts start with (default: the repository's
                        .venv/bin, then the PATH of `up`); launchers forward their own environment
USAGE
}

NAME_PREFIX="dlrm-node"
HEAD_NAME="dlrm-head"
BRIDGE="dlrm0"
HOST_IFACE="dlrm0"
VETH_PREFIX="dlrm-v"
MAX_NODES=200
STATE_DIR="/run/dlrm-cluster"
STATE_FILE="${STATE_DIR}/cluster"
SSH_DROPIN="/etc/ssh/ssh_config.d/dlrm-cluster.conf"
HOSTS_FILE="/etc/hosts"
BLOCK_BEGIN="# BEGIN dlrm-cluster (scripts/test_cluster.sh; its down removes this block)"
BLOCK_END="# END dlrm-cluster"
PRIVSEP_DIR="/run/sshd"
SSHD="/usr/sbin/sshd"
REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "error: $*" >&2; exit 2; }
fail() { echo "error: $*" >&2; exit 1; }
say() { printf '[cluster] %s\n' "$*" >&2; }

# ---- input -----------------------------------------------------------------------------------

# The subnet's first three octets from DLRM_CLUSTER_SUBNET (a.b.c.0/24).
subnet_prefix() {
  local subnet="${DLRM_CLUSTER_SUBNET:-10.213.57.0/24}" octet
  [[ "${subnet}" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.0/24$ ]] \
    || die "DLRM_CLUSTER_SUBNET must be a /24 written a.b.c.0/24, got '${subnet}'"
  for octet in "${BASH_REMATCH[@]:1:3}"; do
    (( 10#${octet} <= 255 )) || die "DLRM_CLUSTER_SUBNET must be a /24 written a.b.c.0/24, got '${subnet}'"
  done
  echo "$((10#${BASH_REMATCH[1]})).$((10#${BASH_REMATCH[2]})).$((10#${BASH_REMATCH[3]}))"
}

node_name() { echo "${NAME_PREFIX}$1"; }
node_address() { echo "$1.$((10 + $2))"; }

# `nodes` and `prefix` of the cluster that is up, from its state file (empty when none is).
NODES=""
PREFIX=""
read_state() {
  NODES=""
  PREFIX=""
  [[ -f "${STATE_FILE}" ]] || return 0
  local key value
  while IFS='=' read -r key value; do
    case "${key}" in
      nodes) NODES="${value}" ;;
      prefix) PREFIX="${value}" ;;
    esac
  done <"${STATE_FILE}"
}

# The index K of host NODE of the cluster that is up; bad input otherwise.
node_index() {
  local node="$1"
  read_state
  [[ -n "${NODES}" ]] || die "no cluster is up (scripts/test_cluster.sh up N makes one); no host '${node}'"
  if [[ "${node}" =~ ^${NAME_PREFIX}([1-9][0-9]*)$ ]] && (( BASH_REMATCH[1] <= NODES )); then
    echo "${BASH_REMATCH[1]}"
  else
    die "no host '${node}' in the cluster (its hosts: ${NAME_PREFIX}1..${NAME_PREFIX}${NODES})"
  fi
}

# ---- what is there -----------------------------------------------------------------------------

sshd_pid_file() { echo "${STATE_DIR}/sshd-$1.pid"; }

# The pid of host NODE's sshd when it runs inside NODE's network namespace, else nothing.
sshd_pid() {
  local node="$1" pid
  pid="$(cat "$(sshd_pid_file "${node}")" 2>/dev/null || true)"
  [[ "${pid}" =~ ^[0-9]+$ ]] || return 0
  [[ "$(ip netns identify "${pid}" 2>/dev/null || true)" == "${node}" ]] || return 0
  echo "${pid}"
}

cluster_namespaces() { ip netns list | awk '{print $1}' | grep -E "^${NAME_PREFIX}[0-9]+$" || true; }
cluster_veths() { ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${VETH_PREFIX}[0-9]+$" || true; }
has_hosts_block() { grep -qxF "${BLOCK_BEGIN}" "${HOSTS_FILE}"; }

# True when the state file's cluster is whole: every host's sshd in its namespace and its link, the
# bridge, the names and ssh settings.
healthy() {
  local k
  read_state
  [[ -n "${NODES}" && -n "${PREFIX}" ]] || return 1
  ip link show "${BRIDGE}" >/dev/null 2>&1 && has_hosts_block && [[ -f "${SSH_DROPIN}" ]] || return 1
  for ((k = 1; k <= NODES; k++)); do
    [[ -n "$(sshd_pid "$(node_name "${k}")")" ]] && ip link show "${VETH_PREFIX}${k}" >/dev/null 2>&1 || return 1
  done
}

leftovers() {
  [[ -e "${STATE_DIR}" || -e "${SSH_DROPIN}" ]] || ip link show "${BRIDGE}" >/dev/null 2>&1 || has_hosts_block \
    || [[ -n "$(cluster_namespaces)$(cluster_veths)" ]]
}

# An interface other than the cluster's bridge with an address in PREFIX.0/24, or a route there.
range_user() {
  local prefix="$1"
  ip -o -4 addr show | awk -v p="${prefix}." -v br="${BRIDGE}" \
    '$2 != br && index($4, p) == 1 { print "interface " $2 " (" $4 ")"; exit }'
  ip -o -4 route show root "${prefix}.0/24" | awk -v br="${BRIDGE}" \
    '{ for (i = 1; i < NF; i++) if ($i == "dev" && $(i + 1) != br) { print "a route via " $(i + 1); exit } }'
}

# ---- making and removing -------------------------------------------------------------------------

write_hosts_file() {  # the hosts file without our block, then the block given on stdin (if any)
  local kept block
  kept="$(awk -v b="${BLOCK_BEGIN}" -v e="${BLOCK_END}" '$0 == b { skip = 1; next } $0 == e { skip = 0; next } !skip' "${HOSTS_FILE}")"
  block="$(cat)"
  # Written in place: /etc/hosts may be a bind mount that a rename cannot replace.
  if [[ -n "${block}" ]]; then printf '%s\n%s\n' "${kept}" "${block}" >"${HOSTS_FILE}"; else printf '%s\n' "${kept}" >"${HOSTS_FILE}"; fi
}

# Every process in the cluster's namespaces (sshd, sessions, jobs), then the namespaces, links,
# names and state: whatever of it is there.
remove_all() {
  local ns pids waited
  for ns in $(cluster_namespaces); do
    pids="$(ip netns pids "${ns}" || true)"
    if [[ -n "${pids}" ]]; then
      # shellcheck disable=SC2086  # one pid per word
      kill -TERM ${pids} 2>/dev/null || true
      for ((waited = 0; waited < 30; waited++)); do
        [[ -n "$(ip netns pids "${ns}" || true)" ]] || break
        sleep 0.1
      done
      pids="$(ip netns pids "${ns}" || true)"
      # shellcheck disable=SC2086
      [[ -z "${pids}" ]] || kill -KILL ${pids} 2>/dev/null || true
    fi
    ip netns delete "${ns}" 2>/dev/null || true
  done
  for ns in $(cluster_veths); do ip link delete "${ns}" 2>/dev/null || true; done
  ! ip link show "${BRIDGE}" >/dev/null 2>&1 || ip link delete "${BRIDGE}"
  ! has_hosts_block || write_hosts_file </dev/null
  rm -f "${SSH_DROPIN}"
  if [[ -f "${STATE_DIR}/made-privsep-dir" ]]; then rmdir "${PRIVSEP_DIR}" 2>/dev/null || true; fi
  rm -rf "${STATE_DIR}"
}

write_ssh_files() {
  local nodes="$1" prefix="$2" session_path="$3" k node names=""
  ssh-keygen -q -t ed25519 -N '' -C dlrm-cluster -f "${STATE_DIR}/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C dlrm-cluster-host -f "${STATE_DIR}/ssh_host_ed25519_key"
  cp "${STATE_DIR}/id_ed25519.pub" "${STATE_DIR}/authorized_keys"
  for ((k = 1; k <= nodes; k++)); do names+="${names:+,}$(node_name "${k}"),$(node_address "${prefix}" "${k}")"; done
  echo "${names} $(cut -d' ' -f1,2 "${STATE_DIR}/ssh_host_ed25519_key.pub")" >"${STATE_DIR}/known_hosts"
  cat >"${SSH_DROPIN}" <<EOF
# Written by scripts/test_cluster.sh up; its down removes this file.
Host ${NAME_PREFIX}* ${prefix}.*
    User root
    IdentityFile ${STATE_DIR}/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile ${STATE_DIR}/known_hosts
    StrictHostKeyChecking yes
    BatchMode yes
    LogLevel ERROR
    ConnectTimeout 10
    ServerAliveInterval 5
    ServerAliveCountMax 3
EOF
  for ((k = 1; k <= nodes; k++)); do
    node="$(node_name "${k}")"
    cat >"${STATE_DIR}/sshd-${node}.conf" <<EOF
ListenAddress $(node_address "${prefix}" "${k}"):22
HostKey ${STATE_DIR}/ssh_host_ed25519_key
PidFile $(sshd_pid_file "${node}")
AuthorizedKeysFile ${STATE_DIR}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 100
MaxSessions 100
ClientAliveInterval 5
ClientAliveCountMax 3
SetEnv "PATH=${session_path}"
EOF
  done
}

start_host() {
  local k="$1" prefix="$2" node veth
  node="$(node_name "${k}")"
  veth="${VETH_PREFIX}${k}"
  ip netns add "${node}"
  ip link add "${veth}" type veth peer name "${HOST_IFACE}" netns "${node}"
  ip link set "${veth}" master "${BRIDGE}" up
  ip -n "${node}" link set lo up
  ip -n "${node}" addr add "$(node_address "${prefix}" "${k}")/24" dev "${HOST_IFACE}"
  ip -n "${node}" link set "${HOST_IFACE}" up
  # sshd daemonizes inside both namespaces, and every session it spawns inherits them.
  # shellcheck disable=SC2016  # the inner shell expands its own arguments
  ip netns exec "${node}" unshare --uts sh -c 'hostname "$1" && exec "$2" -f "$3" -E "$4"' sh \
    "${node}" "${SSHD}" "${STATE_DIR}/sshd-${node}.conf" "${STATE_DIR}/sshd-${node}.log" 9<&-
}

wait_for_ssh() {
  local node="$1" tries
  for ((tries = 0; tries < 50; tries++)); do
    [[ "$(ssh -o ConnectTimeout=2 "${node}" hostname 2>/dev/null || true)" != "${node}" ]] || return 0
    sleep 0.2
  done
  return 1
}

up_failed() {  # the EXIT trap while `up` builds: a failure removes whatever it made
  (( $1 == 0 )) && return 0
  echo "error: up failed (exit $1); what it made is removed" >&2
  remove_all
}

do_up() {
  [[ $# -eq 1 ]] || die "up takes the number of hosts (up N), got $# arguments"
  if [[ ! "$1" =~ ^[1-9][0-9]{0,2}$ ]] || (( $1 > MAX_NODES )); then
    die "up N: N must be a whole number from 1 to ${MAX_NODES}, got '$1'"
  fi
  local nodes="$1" prefix user k node session_path
  prefix="$(subnet_prefix)"
  user="$(range_user "${prefix}")"
  [[ -z "${user}" ]] || die "${prefix}.0/24 is in use by ${user%%$'\n'*}; set DLRM_CLUSTER_SUBNET to a free /24"
  command -v "${SSHD}" >/dev/null || fail "${SSHD} not found (Debian package openssh-server; scripts/setup.sh installs it)"
  if [[ ! -d "$(dirname "${SSH_DROPIN}")" ]] || ! command -v ssh >/dev/null; then
    fail "ssh or $(dirname "${SSH_DROPIN}") not found (Debian package openssh-client; scripts/setup.sh installs it)"
  fi
  if healthy; then
    [[ "${NODES}" == "${nodes}" && "${PREFIX}" == "${prefix}" ]] \
      || die "a cluster of ${NODES} hosts on ${PREFIX}.0/24 is up; scripts/test_cluster.sh down first"
    say "a cluster of ${nodes} hosts is already up"
    return 0
  fi
  if leftovers; then
    say "removing what an earlier cluster left behind"
    remove_all
  fi
  trap 'up_failed $?' EXIT
  mkdir -m 700 "${STATE_DIR}"
  if [[ ! -d "${PRIVSEP_DIR}" ]]; then
    mkdir -m 755 "${PRIVSEP_DIR}"
    touch "${STATE_DIR}/made-privsep-dir"
  fi
  session_path="${DLRM_CLUSTER_PATH:-${PATH}}"
  [[ -n "${DLRM_CLUSTER_PATH:-}" || ! -d "${REPO_DIR}/.venv/bin" ]] || session_path="${REPO_DIR}/.venv/bin:${session_path}"
  write_ssh_files "${nodes}" "${prefix}" "${session_path}"
  {
    echo "${prefix}.1 ${HEAD_NAME}"
    for ((k = 1; k <= nodes; k++)); do echo "$(node_address "${prefix}" "${k}") $(node_name "${k}")"; done
  } | { echo "${BLOCK_BEGIN}"; cat; echo "${BLOCK_END}"; } | write_hosts_file
  ip link add "${BRIDGE}" type bridge stp_state 0 forward_delay 0
  ip addr add "${prefix}.1/24" dev "${BRIDGE}"
  ip link set "${BRIDGE}" up
  for ((k = 1; k <= nodes; k++)); do start_host "${k}" "${prefix}"; done
  for ((k = 1; k <= nodes; k++)); do
    node="$(node_name "${k}")"
    wait_for_ssh "${node}" || { say "$(tail -n 5 "${STATE_DIR}/sshd-${node}.log" 2>/dev/null || true)"; false; }
  done
  printf 'nodes=%s\nprefix=%s\n' "${nodes}" "${prefix}" >"${STATE_FILE}"
  trap - EXIT
  say "up: ${nodes} hosts on ${prefix}.0/24 (${NAME_PREFIX}1..${NAME_PREFIX}${nodes}); scripts/test_cluster.sh status shows them"
}

do_down() {
  [[ $# -eq 0 ]] || die "down takes no arguments, got '$*'"
  if leftovers; then
    remove_all
    say "down: the cluster is removed"
  else
    say "down: no cluster was up"
  fi
}

# `up` or `cut` from the bridge side of host K's link; the rate limit of K's bridge-side qdisc.
link_state() { if ip -o link show "${VETH_PREFIX}$1" | grep -q '[<,]UP[,>]'; then echo up; else echo cut; fi; }
rate_limit() {
  local rate
  rate="$(tc qdisc show dev "${VETH_PREFIX}$1" | sed -n 's/.*qdisc tbf .* rate \([^ ]*\) .*/\1/p')"
  echo "${rate:-unlimited}"
}

do_status() {
  [[ $# -eq 0 ]] || die "status takes no arguments, got '$*'"
  if ! healthy; then
    if [[ -n "${NODES}" ]]; then echo "the cluster of ${NODES} hosts is broken (scripts/test_cluster.sh up ${NODES} rebuilds it)"; else echo "no cluster is up"; fi
    return 1
  fi
  local k node pid
  printf '%-12s %-16s %-5s %-10s %s\n' HOST ADDRESS LINK RATE SSHD
  for ((k = 1; k <= NODES; k++)); do
    node="$(node_name "${k}")"
    pid="$(sshd_pid "${node}")"
    printf '%-12s %-16s %-5s %-10s %s\n' "${node}" "$(node_address "${PREFIX}" "${k}")" "$(link_state "${k}")" \
      "$(rate_limit "${k}")" "${pid:+pid ${pid}}"
  done
}

do_run() {
  [[ $# -ge 2 ]] || die "run takes a host and a command (run NODE CMD...)"
  local node="$1" pid
  node_index "${node}" >/dev/null
  read_state
  shift
  pid="$(sshd_pid "${node}")"
  [[ -n "${pid}" ]] || fail "${node}'s sshd is not running (scripts/test_cluster.sh up ${NODES} rebuilds the cluster)"
  exec nsenter --target "${pid}" --net --uts --mount --wd="${PWD}" -- "$@"
}

do_link() {  # cut or heal
  local verb="$1" k
  [[ $# -eq 2 ]] || die "${verb} takes one host (${verb} NODE)"
  k="$(node_index "$2")"
  if [[ "${verb}" == cut ]]; then ip link set "${VETH_PREFIX}${k}" down; else ip link set "${VETH_PREFIX}${k}" up; fi
}

do_slow() {
  [[ $# -eq 2 ]] || die "slow takes a host and a rate (slow NODE MBIT; 0 lifts the limit)"
  local node="$1" mbit="$2" k burst
  k="$(node_index "${node}")"
  if [[ ! "${mbit}" =~ ^[0-9]{1,6}$ ]] || (( 10#${mbit} > 100000 )); then
    die "slow ${node} MBIT: MBIT must be a whole number of Mbit/s from 0 (no limit) to 100000, got '${mbit}'"
  fi
  mbit=$((10#${mbit}))
  if (( mbit == 0 )); then
    tc qdisc del dev "${VETH_PREFIX}${k}" root 2>/dev/null || true
    tc -n "${node}" qdisc del dev "${HOST_IFACE}" root 2>/dev/null || true
    return 0
  fi
  # The bucket holds 5 ms of traffic (at least two full frames): bursts stay short next to the rate.
  burst=$(( mbit * 1000000 / 8 / 200 ))
  (( burst >= 3200 )) || burst=3200
  # Each side's egress: into the host on the bridge side, out of it on the host's side.
  tc qdisc replace dev "${VETH_PREFIX}${k}" root tbf rate "${mbit}mbit" burst "${burst}" latency 50ms
  tc -n "${node}" qdisc replace dev "${HOST_IFACE}" root tbf rate "${mbit}mbit" burst "${burst}" latency 50ms
}

main() {
  case "${1:-}" in
    -h | --help) usage; exit 0 ;;
    "") die "no verb given (up, down, status, run, cut, heal, slow; see --help)" ;;
  esac
  local verb="$1"
  shift
  case "${verb}" in
    up | down | status | run | cut | heal | slow) ;;
    *) die "unknown verb '${verb}' (up, down, status, run, cut, heal, slow; see --help)" ;;
  esac
  [[ "$(id -u)" == 0 ]] || die "scripts/test_cluster.sh needs root (network namespaces, /etc/hosts)"
  if [[ "${verb}" != run ]]; then
    # One change at a time: the hosts file is the shared resource every verb but run may edit.
    exec 9<"${HOSTS_FILE}"
    flock 9
  fi
  case "${verb}" in
    up) do_up "$@" ;;
    down) do_down "$@" ;;
    status) do_status "$@" ;;
    run) do_run "$@" ;;
    cut | heal) do_link "${verb}" "$@" ;;
    slow) do_slow "$@" ;;
  esac
}

main "$@"
