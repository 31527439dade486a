#!/usr/bin/env bash
# Every check that needs a GPU, in one run, each step under its own time limit, each log in LOGDIR:
#
#   bash benchmarks/gpu_check.sh [LOGDIR]      # default: gpu-logs
#
#   env.txt       the GPU, driver and versions (nvidia-smi, Python, CuPy, torch, NumPy, nvcc)
#   pytest.txt    tests/test_gpu_attention.py (the kernels against float64), tests/test_gpu_engine.py
#                 and test_device_agnostic.py (the engine on CuPy), and tests/test_kernels_compile.py
#   demo.txt      ag demo attention --device gpu
#   bench.txt     benchmarks/gpu_attention.py (N from $GPU_BENCH_N, default 1024 2048), and bench.json
#   profile.txt   Nsight Compute on the float32 and bf16 kernels, forward and backward (d = 128, N = 2048): launch,
#                 occupancy, speed of light, compute and memory workload
#   sanitize.txt  benchmarks/gpu_sanitize.sh: memcheck, racecheck, synccheck
#
# GPU_STEPS picks the steps (default: pytest demo bench profile sanitize); GPU_<STEP>_SECONDS their
# time limits; GPU_PLOTS the demo's plot folder (default LOGDIR/plots). pytest runs on GPU_PYTEST_WORKERS
# processes (default 8) where pytest-xdist is installed. One step failing does not stop the others; the exit status is the number of steps that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${1:-gpu-logs}
mkdir -p "$LOGDIR"
PY=$(command -v python3 || command -v python)
if ! command -v python >/dev/null; then  # gpu_sanitize.sh calls `python`
  mkdir -p /tmp/ag-gpu-bin && ln -sf "$PY" /tmp/ag-gpu-bin/python && export PATH=/tmp/ag-gpu-bin:$PATH
fi
export PATH=$PATH:/usr/local/cuda/bin  # nvcc and compute-sanitizer, where the toolkit is not on PATH
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
failed=0
read -r -d '' PROFILED <<'EOF' || true
import cupy as cp
from ag.attention import gpu

rng = cp.random.default_rng(0)
q, k, v = (rng.standard_normal((4, 16, 2048, 128), dtype=cp.float32) for _ in range(3))
o, lse = gpu.forward(q, k, v)
gpu.backward(q, k, v, o, lse, q)
o, lse = gpu.forward_bf16(q, k, v)
gpu.backward_bf16(q, k, v, o, lse, q)
cp.cuda.Device().synchronize()
EOF

STEPS=" ${GPU_STEPS:-pytest demo bench profile sanitize} "

step() {  # step NAME SECONDS COMMAND...: run it with a time limit, log to LOGDIR/NAME.txt
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  echo "== $name (at most ${limit} s): $*"
  timeout "$limit" "$@" >"$LOGDIR/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s: $(grep -v '^\s*$' "$LOGDIR/$name.txt" | tail -n 1)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  "$PY" -c "import sys, numpy, cupy; print('Python', sys.version.split()[0], '| NumPy', numpy.__version__, '| CuPy', cupy.__version__, '| CUDA runtime', cupy.cuda.runtime.runtimeGetVersion())"
  "$PY" -c "import torch; print('torch', torch.__version__, '| CUDA', torch.version.cuda, '|', torch.cuda.get_device_name())"
  nvcc --version | tail -n 2
  lscpu | grep 'Model name'
} >"$LOGDIR/env.txt" 2>&1
cat "$LOGDIR/env.txt"

WORKERS=()
"$PY" -c "import xdist" 2>/dev/null && WORKERS=(-n "${GPU_PYTEST_WORKERS:-8}")
step pytest "${GPU_PYTEST_SECONDS:-180}" "$PY" -m pytest -q -p no:cacheprovider -rf --maxfail=40 "${WORKERS[@]}" \
  tests/test_gpu_attention.py tests/test_gpu_engine.py tests/test_device_agnostic.py tests/test_kernels_compile.py
step demo 60 "$PY" -m ag demo attention --device gpu --out "${GPU_PLOTS:-$LOGDIR/plots}"
step bench "${GPU_BENCH_SECONDS:-120}" "$PY" benchmarks/gpu_attention.py --n ${GPU_BENCH_N:-1024 2048} \
  --json "$LOGDIR/bench.json"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
step profile "${GPU_PROFILE_SECONDS:-120}" "${NCU:-ncu}" --section LaunchStats --section Occupancy \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  -k regex:'flash_(fwd|bwd_dkdv|bwd_dq)' -c 6 \
  "$PY" -c "$PROFILED"
step sanitize "${GPU_SANITIZE_SECONDS:-150}" bash benchmarks/gpu_sanitize.sh
echo "gpu_check: $failed step(s) failed; logs in $LOGDIR"
exit "$failed"
