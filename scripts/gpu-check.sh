#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# gpu-check.sh: on a lent GPU machine, from the checkout with build-gpu-kit/ carried beside it
# (scripts/gpu-kit.sh makes it), check the sidecar on the real driver and write ONE report file.
# Steps, each with its own time limit inside an overall budget (default 450 s, under 8 minutes):
#   preflight  driver, GPUs (name, UUID, compute mode), open or proprietary kernel module,
#              nvidia_peermem, RDMA devices, Python and PyTorch
#   daemon     nats-server and rdma-sidecar from the kit start; rdma-sidecar-ctl info answers
#   probe      tools/gpu_probe.py: what the real driver answers on IPC, dma-buf, VMM, PyTorch
#   tests      tests/gpu/test_*.py (the ctest label "gpu") against the kit's daemon
#   torch      examples/torch_read.py --device cuda:0 between two sidecars
#   bench      bench/gpu_bench.py (small sizes: a smoke figure, not the benchmark of record)
# A step that cannot run here is SKIPPED with its reason (no GPU, no python3...), so the same
# script runs in a bare chroot without a GPU (tests/gpu/test_gpu_kit.py does exactly that).
# Exit 0 when no step FAILED; 1 otherwise.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KIT=$ROOT/build-gpu-kit
REPORT=$ROOT/gpu-check-report.txt
BUDGET=450
PY=${PYTHON:-}
ONLY=""
STAND_IN=""

usage() {
  cat <<EOF
usage: bash scripts/gpu-check.sh [--kit DIR] [--report FILE] [--budget SECONDS] [--python PY] [--only STEPS]

  --kit DIR         the kit from scripts/gpu-kit.sh (default: build-gpu-kit)
  --report FILE     the report (default: gpu-check-report.txt in the checkout)
  --budget SECONDS  the whole run's time limit (default: $BUDGET)
  --python PY       the Python with grpcio/protobuf/torch (default: \$PYTHON, else
                    /opt/torch/.venv/bin/python3 when present, else python3 on PATH)
  --only STEPS      comma-separated subset of: preflight,daemon,probe,tests,torch,bench
  --stand-in        no GPU here: run tests and bench on the kit's stand-in driver
                    (tests/libsc_fake_cuda.so; tests/integration's GPU suites instead of tests/gpu).
                    Checks the kit and this script, proves nothing about GPUs
Exit 0 when no step failed (skipped steps say why), 1 otherwise.
EOF
}

while [ $# -gt 0 ]; do
  case "$1" in
    --kit) KIT=$(realpath -m "$2"); shift 2 ;;
    --report) REPORT=$(realpath -m "$2"); shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --stand-in) STAND_IN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done

[ -x "$KIT/bin/rdma-sidecar" ] || { echo "gpu-check: no kit at $KIT (make it with scripts/gpu-kit.sh and carry build-gpu-kit)" >&2; exit 1; }
if [ -z "$PY" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3
  else PY=$(command -v python3 || true); fi
fi

START=$(date +%s)
WORK=$(mktemp -d /tmp/sc-gpucheck-XXXXXX)
export WORK KIT ROOT PY
# Daemons the steps start in the background: their pids, killed when the check ends (a step that
# runs over its limit is killed without a chance to stop them itself).
PIDFILE=$WORK/pids
export PIDFILE
cleanup() {
  local p
  [ -f "$PIDFILE" ] || { rm -rf "$WORK"; return; }
  while read -r p; do kill -TERM "$p" 2>/dev/null; done <"$PIDFILE"
  sleep 1
  while read -r p; do kill -KILL "$p" 2>/dev/null; done <"$PIDFILE"
  rm -rf "$WORK"
}
trap cleanup EXIT
bg() { "$@" & echo $! >>"$PIDFILE"; }
: >"$REPORT"
FAILED=0

say() { echo "$*" | tee -a "$REPORT"; }
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
wanted() { [ -z "$ONLY" ] || [[ "$ONLY" == *",$1,"* ]]; }
# step NAME LIMIT CMD...: runs CMD with min(LIMIT, budget left) seconds, its output into the report.
step() {
  local name=$1 limit=$2; shift 2
  local t; t=$(left)
  [ "$t" -lt "$limit" ] && limit=$t
  if [ "$limit" -le 5 ]; then say "== $name: SKIPPED (the ${BUDGET}s budget is spent)"; return; fi
  say "== $name (limit ${limit}s)"
  local t0; t0=$(date +%s)
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" >"$WORK/out" 2>&1
  local rc=$?
  sed 's/^/   /' "$WORK/out" >>"$REPORT"
  tail -n 5 "$WORK/out" | sed 's/^/   /'
  local dt=$(( $(date +%s) - t0 ))
  if [ $rc -eq 0 ]; then say "-- $name: PASS (${dt}s)"
  elif [ $rc -eq 77 ]; then say "-- $name: SKIPPED (${dt}s; see above)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then say "-- $name: FAILED: over its ${limit}s limit"; FAILED=1
  else say "-- $name: FAILED (exit $rc, ${dt}s)"; FAILED=1; fi
}
skip() { say "== $1: SKIPPED ($2)"; }

have_gpu() { [ -n "${STAND_IN:-}" ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; }
have_torch_cuda() { [ -n "$PY" ] && "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

say "# rdma-sidecar GPU check, $(date -u +%FT%TZ), $(uname -srm), checkout $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
say "# kit: $(head -1 "$KIT/MANIFEST" 2>/dev/null | sed 's/^# //'); $(tail -1 "$KIT/MANIFEST" 2>/dev/null | sed 's/^# //')"
say "# python: ${PY:-none}"

preflight() {
  echo "driver and GPUs:"
  if have_gpu; then
    nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version,compute_mode,memory.total --format=csv
  else
    echo "  nvidia-smi: not found or no GPU"
  fi
  echo "kernel module: $(head -1 /proc/driver/nvidia/version 2>/dev/null || echo 'no /proc/driver/nvidia/version (no NVIDIA kernel module)')"
  grep -qi "open kernel module" /proc/driver/nvidia/version 2>/dev/null &&
    echo "  the OPEN kernel module (dma-buf export supported)" || echo "  not the open kernel module (or none)"
  [ -d /sys/module/nvidia_peermem ] && echo "nvidia_peermem: loaded" || echo "nvidia_peermem: not loaded"
  echo "RDMA devices: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ' || true)"
  [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ] || echo "  none (GPUDirect RDMA cannot be exercised; staging and LOCAL can)"
  if [ -n "$PY" ]; then
    "$PY" -c 'import sys; print("python", sys.version.split()[0])'
    "$PY" -c 'import grpc, google.protobuf as p; print("grpcio", grpc.__version__, "protobuf", p.__version__)' 2>&1
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1
  else
    echo "python3: not found"
  fi
  return 0
}

daemon() {
  local d=$WORK/daemon; mkdir -p "$d/shm"
  local port=$(( 20000 + RANDOM % 20000 ))
  bg "$KIT/bin/nats-server" -a 127.0.0.1 -p "$port" >"$d/nats.log" 2>&1
  bg "$KIT/bin/rdma-sidecar" --id check --grpc-listen "unix:$d/s.sock" --shm-dir "$d/shm" \
    --data-listen 127.0.0.1:0 --nats-url "nats://127.0.0.1:$port" >"$d/sidecar.log" 2>&1
  local pid; pid=$(tail -1 "$PIDFILE")
  for _ in $(seq 100); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
  if ! "$KIT/bin/rdma-sidecar-ctl" --sidecar "unix:$d/s.sock" --connect-timeout 10 info; then
    echo "rdma-sidecar-ctl info failed; the sidecar's log:"; cat "$d/sidecar.log"; return 1
  fi
  "$KIT/bin/rdma-sidecar-ctl" --sidecar "unix:$d/s.sock" --connect-timeout 10 health || return 1
  kill -TERM "$pid"; wait "$pid"; local rc=$?
  echo "rdma-sidecar exited with $rc after SIGTERM"
  [ $rc -eq 0 ]
}

if [ -n "$STAND_IN" ]; then
  [ -f "$KIT/tests/libsc_fake_cuda.so" ] || { echo "gpu-check: --stand-in: the kit has no tests/libsc_fake_cuda.so" >&2; exit 1; }
  export STAND_IN SC_FAKE_CUDA=$KIT/tests/libsc_fake_cuda.so
  say "# STAND-IN driver ($SC_FAKE_CUDA): GPU steps run on host memory and prove nothing about GPUs"
fi
export SC_BINARY=$KIT/bin/rdma-sidecar SC_PYTHON_STUBS=$KIT/python SC_SOURCE_DIR=$ROOT
export SC_TEST_TMP=$WORK/tmp PATH=$KIT/bin:$PATH
export PYTHONPATH=$KIT/python:$ROOT/clients/python${PYTHONPATH:+:$PYTHONPATH}

tests() {
  local rc=0 t set=("$ROOT"/tests/gpu/test_*.py)
  [ -n "${STAND_IN:-}" ] && set=("$ROOT"/tests/integration/test_gpu_regions.py "$ROOT"/tests/integration/test_gpu_torch.py)
  for t in "${set[@]}"; do
    [ "$(basename "$t")" = test_gpu_kit.py ] && continue
    echo "--- $(basename "$t")"
    "$PY" "$t" 2>&1; local r=$?
    [ $r -eq 0 ] || [ $r -eq 77 ] || rc=1
  done
  return $rc
}

torch_pair() {
  local d=$WORK/torch; mkdir -p "$d"
  for n in a b; do
    mkdir -p "$d/$n/shm"
    bg "$KIT/bin/rdma-sidecar" --id "$n" --grpc-listen "unix:$d/$n/s.sock" --shm-dir "$d/$n/shm" \
      --data-listen 127.0.0.1:0 --key-file "$d/keys" >"$d/$n.log" 2>&1
  done
  return 0
}

torch_read() {
  local d=$WORK/torch; mkdir -p "$d"
  "$PY" - "$d/keys" <<'EOF' || return 1
import sys
sys.path.insert(0, __import__("os").environ["SC_SOURCE_DIR"] + "/tests/integration")
import harness
harness.write_key_file(sys.argv[1])
EOF
  torch_pair
  for n in a b; do for _ in $(seq 100); do [ -S "$d/$n/s.sock" ] && break; sleep 0.1; done; done
  "$PY" "$ROOT/examples/torch_read.py" expose --sidecar "unix:$d/a/s.sock" --device cuda:0 \
    --metadata-file "$d/md" --timeout 60 & local ex=$!
  "$PY" "$ROOT/examples/torch_read.py" read --sidecar "unix:$d/b/s.sock" --device cuda:0 \
    --metadata-file "$d/md" --timeout 60; local rc=$?
  wait "$ex" || rc=1
  return $rc
}

bench() {
  "$PY" "$ROOT/bench/gpu_bench.py" --build "$KIT" --size 64MiB --iters 3 ${STAND_IN:+--stand-in}
}

export -f bg have_gpu have_torch_cuda preflight daemon tests torch_pair torch_read bench

wanted preflight && step preflight 30 preflight
wanted daemon && step daemon 30 daemon
if wanted probe; then
  if [ -n "$STAND_IN" ]; then skip probe "--stand-in: the probe is for the real driver"
  elif ! have_gpu; then skip probe "no GPU (nvidia-smi finds none)"
  elif [ -z "$PY" ]; then skip probe "no python3"
  elif [ ! -f "$KIT/tools/gpu_probe.py" ]; then skip probe "the kit has no tools/gpu_probe.py"
  else
    cp "$KIT/tools/gpu_probe.py" "$WORK/gpu_probe.py"
    step probe 120 "$PY" "$WORK/gpu_probe.py" "$ROOT/examples"
  fi
fi
if wanted tests; then
  if ! have_gpu; then skip tests "no GPU"
  elif [ -z "$PY" ]; then skip tests "no python3"
  else step tests 240 tests; fi
fi
if wanted torch; then
  if ! have_gpu; then skip torch "no GPU"
  elif [ -n "$STAND_IN" ]; then skip torch "--stand-in: PyTorch's CUDA tensors need a GPU"
  elif ! have_torch_cuda; then skip torch "no PyTorch with CUDA in ${PY:-python3}"
  else step torch 90 torch_read; fi
fi
if wanted bench; then
  if ! have_gpu; then skip bench "no GPU"
  elif [ -z "$PY" ]; then skip bench "no python3"
  else step bench 120 bench; fi
fi
say "# done in $(( $(date +%s) - START ))s: $([ $FAILED = 0 ] && echo 'no step failed' || echo 'SOME STEPS FAILED')"
echo "gpu-check: report in $REPORT"
exit $FAILED
