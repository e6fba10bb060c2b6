#!/usr/bin/env bash
# CI's short run of each clustered engine (docs/cluster.md): a 3-node NATS JetStream cluster
# under the FastStream edge, a 3-node MariaDB Galera cluster, and Patroni (3 PostgreSQL
# members, one etcd, synchronous mode) under the chaos harness. Each exits non-zero on any
# doubled or lost operation, a dead letter Galera should not cause, or a cluster that would
# not start; this script then does too, after running the others.
#
#   tools/cluster/ci_stage.sh [PYTHON]
#
# PYTHON: an interpreter with the package and its `test` extra installed (default: a venv of
# its own, .ci-venvs/cluster). Installs the Debian packages it needs when their binaries are
# missing (nats-server, galera-4, rsync, patroni, etcd-server; MariaDB and PostgreSQL are
# the machine's). Everything runs on loopback ports with data in temporary directories, and
# is torn down at the end of each run.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
export CI="${CI:-true}"

need() {  # need BINARY-OR-PATH PACKAGE: apt-get install PACKAGE when it is missing
  if ! command -v "$1" >/dev/null 2>&1 && [ ! -e "$1" ]; then
    echo "ci-cluster: installing $2 (for $1)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null \
      || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null; }
  fi
}

need nats-server nats-server
need /usr/lib/galera/libgalera_smm.so galera-4
need rsync rsync
need patroni patroni
need etcd etcd-server

PYTHON=${1:-}
if [ -z "$PYTHON" ]; then
  venv="$ROOT/.ci-venvs/cluster"
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -qq --upgrade pip
  fi
  "$venv/bin/pip" install -qq -e '.[test]'
  PYTHON="$venv/bin/python"
fi

failed=()
step() {  # step NAME COMMAND...: run, time, remember a failure
  local name=$1 started status
  shift
  started=$(date +%s)
  echo "== $name"
  "$@"
  status=$?
  echo "== $name: exit $status, $(( $(date +%s) - started )) s"
  [ "$status" -eq 0 ] || failed+=("$name")
}

step "nats-jetstream (3 nodes, R3 stream)" \
  "$PYTHON" tools/cluster/nats_node_loss.py --ops 400 --min-faults 2 --fault-interval 2 --timeout 60
step "galera (3 nodes)" \
  "$PYTHON" tools/cluster/galera_conflicts.py --ops 300 --min-faults 2 --fault-interval 2
patroni() {  # the chaos harness on Patroni; at least one failover must have happened
  local out
  out=$(mktemp)
  "$PYTHON" tools/chaos/run.py --cluster patroni --replication sync --ops 600 --workers 3 \
    --cluster-fault-interval 5 | tee "$out"
  local status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ] && ! grep -q "pg_failover=[1-9]" "$out"; then
    echo "ci-cluster: the Patroni run ended before its first failover"
    status=1
  fi
  rm -f "$out"
  return "$status"
}
step "patroni sync (3 members + etcd)" patroni

if [ "${#failed[@]}" -ne 0 ]; then
  echo "ci-cluster: FAILED: ${failed[*]}"
  exit 1
fi
echo "ci-cluster: every engine held: nothing doubled, nothing lost"
