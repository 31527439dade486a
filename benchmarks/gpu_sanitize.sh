#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck on small cases of every CUDA kernel in
# ag/attention/kernels/ (float32 and bf16, forward and backward): boundary tiles (Nq = 70, Nk = 45), GQA,
# all three masks, d = 16, 17 (scalar loads) and 80. Needs a GPU, CuPy and the CUDA toolkit.
#
#   bash benchmarks/gpu_sanitize.sh
#
# CuPy's memory pool is switched off so that every array is its own allocation and memcheck sees
# an access past its end. Exit status 1 on the first error a tool reports.
set -euo pipefail
cd "$(dirname "$0")/.."

SANITIZER=${COMPUTE_SANITIZER:-compute-sanitizer}
command -v "$SANITIZER" >/dev/null || {
  echo "gpu_sanitize: $SANITIZER not found (it comes with the CUDA toolkit; set COMPUTE_SANITIZER=/path/to/it)" >&2
  exit 1
}
python -c "import sys, ag.attention.gpu as m; ok, why = m.available(); ok or sys.exit(f'gpu_sanitize: no GPU: {why}')"

read -r -d '' CASES <<'EOF' || true
import cupy as cp
from ag.attention import gpu as m

cp.cuda.set_allocator(None)
rng = cp.random.default_rng(0)
for d in (16, 17, 80):
    q = rng.standard_normal((1, 4, 70, d), dtype=cp.float32)
    k = rng.standard_normal((1, 2, 45, d), dtype=cp.float32)
    v = rng.standard_normal((1, 2, 45, d), dtype=cp.float32)
    for causal in (False, True, "bottom_right"):
        o, lse = m.forward(q, k, v, causal=causal)
        m.backward(q, k, v, o, lse, cp.ones_like(o), causal=causal)
        o, lse = m.forward_bf16(q, k, v, causal=causal)
        m.backward_bf16(q, k, v, o, lse, cp.ones_like(o), causal=causal)
cp.cuda.Device().synchronize()
print("cases ran")
EOF

echo "== compiling the kernels (outside the sanitizer; CuPy caches them on disk)"
python -c "$CASES"
for tool in memcheck racecheck synccheck; do
  echo "== compute-sanitizer --tool $tool"
  "$SANITIZER" --tool "$tool" --error-exitcode 1 python -c "$CASES"
done
echo "gpu_sanitize: memcheck, racecheck and synccheck clean"
