#!/usr/bin/env bash
# The CPU goals on a machine of another kind, in one run of about 8 to 10 minutes on 2 cores: each step
# under its own time limit, each log in LOGDIR. For a many-core host (a GPU machine's Xeon), it pins
# every step to CPU_CORES (default 0,1) and sets every thread count to match, as a 2-vCPU guest is:
#
#   bash benchmarks/cpu_check.sh [LOGDIR]      # default: cpu-logs
#
#   env.txt        the CPU (lscpu), whether the pinned CPUs share a physical core (thread siblings),
#                  Python, NumPy and its BLAS, torch; benchmarks/exp_floor.py (NumPy's exp here)
#   attention.txt  benchmarks/attention.py at N = 2048 and 4096 (5 turns), then its anatomy (a tile's calls)
#   transformer.txt benchmarks/transformer.py --no-memory --repeats 3
#   mlp.txt        benchmarks/mlp.py --no-memory --repeats 3
#   quick.txt      benchmarks/run_all.py --quick: every goal line at small sizes
#
# CPU_STEPS picks the steps (default: env attention transformer mlp quick); CPU_<STEP>_SECONDS their
# time limits. One step failing does not stop the others; the exit status is the number that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${1:-cpu-logs}
mkdir -p "$LOGDIR"
CORES=${CPU_CORES:-0,1}
N_CORES=$(( $(tr -cd , <<<"$CORES" | wc -c) + 1 ))
export OMP_NUM_THREADS=$N_CORES OPENBLAS_NUM_THREADS=$N_CORES MKL_NUM_THREADS=$N_CORES
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
PIN=(taskset -c "$CORES")
command -v taskset >/dev/null || PIN=()
failed=0

step() {  # step NAME DEFAULT_SECONDS COMMAND...: run COMMAND pinned, under its limit, into LOGDIR/NAME.txt
  local name=$1 seconds=$2
  shift 2
  local limit_var="CPU_${name^^}_SECONDS"
  [[ " ${CPU_STEPS:-env attention transformer mlp quick} " == *" $name "* ]] || return 0
  echo "== $name (limit ${!limit_var:-$seconds} s)"
  local run=(timeout "${!limit_var:-$seconds}")
  [[ $(type -t "$1") == function ]] && run=()  # a function of this script: timeout cannot run it
  if ! "${run[@]}" "$@" >"$LOGDIR/$name.txt" 2>&1; then
    echo "   $name failed or ran out of time: see $LOGDIR/$name.txt"
    failed=$((failed + 1))
  fi
}

env_report() {
  lscpu
  echo
  for cpu in ${CORES//,/ }; do
    echo "cpu$cpu thread siblings: $(cat /sys/devices/system/cpu/cpu$cpu/topology/thread_siblings_list 2>/dev/null)"
  done
  echo "pinned to: $CORES ($N_CORES cores); thread variables: $N_CORES"
  "$PY" - <<'EOF'
import platform
import numpy
print("Python", platform.python_version(), "NumPy", numpy.__version__)
try:
    from threadpoolctl import threadpool_info
    for pool in threadpool_info():
        print(pool.get("internal_api"), pool.get("version"), pool.get("architecture"), pool.get("num_threads"))
except ImportError:
    print("threadpoolctl: not installed")
try:
    import torch
    print("torch", torch.__version__, "threads", torch.get_num_threads())
except ImportError:
    print("torch: not installed")
EOF
  echo
  "${PIN[@]}" "$PY" benchmarks/exp_floor.py
}

step env 60 env_report
step attention 240 "${PIN[@]}" "$PY" benchmarks/attention.py --sizes 2048,4096 --repeats 5,5 --naive-repeats 1,1 \
  --skip sweep,memory
step transformer 150 "${PIN[@]}" "$PY" benchmarks/transformer.py --no-memory --repeats 3
step mlp 240 "${PIN[@]}" "$PY" benchmarks/mlp.py --no-memory --repeats 3
step quick 300 "${PIN[@]}" "$PY" benchmarks/run_all.py --quick
grep -h "^goal" "$LOGDIR"/*.txt 2>/dev/null
exit "$failed"
