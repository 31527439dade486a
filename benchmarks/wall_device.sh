#!/bin/sh
# One device run for lecture 7's parallel sections: the pipeline bubble in seconds on quiet cores (MPI), and
# offloading to host memory from CuPy against recomputing, with this GPU's PCIe and matmul rates.
# Usage: sh benchmarks/wall_device.sh OUTDIR
out=${1:-/tmp/wall}; mkdir -p "$out"; export PYTHONPATH=$PWD OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
python3 -c "import numpy, sys; print('python', sys.version.split()[0], 'numpy', numpy.__version__)" 2>&1
python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
python3 -c "import mpi4py; print('mpi4py', mpi4py.__version__)" 2>&1 | tail -1
if command -v mpiexec >/dev/null && python3 -c "import mpi4py" 2>/dev/null; then
  for p in 2 4; do
    timeout 120 mpiexec -n $p python3 -m ag.parallel.pipeline --hidden 1024 --rows 1024 --micro-batches 4 8 16 \
      | tee "$out/pipeline_p$p.txt"
  done
fi
timeout 150 python3 - <<'PY' 2>&1 | tee "$out/offload_gpu.txt"
import time, numpy as np
import cupy as cp
import ag
from ag import offload
n, rows, h = 16, 8192, 4096
rng = np.random.default_rng(0)
ws = [ag.Tensor(cp.asarray((rng.standard_normal((h, h)) / np.sqrt(h)).astype(np.float32)), requires_grad=True) for _ in range(n)]
layers = [lambda t, w=w: ag.tanh(t @ w) for w in ws]
x = ag.Tensor(cp.asarray(rng.standard_normal((rows, h)).astype(np.float32)))
one = rows * h * 4
a = cp.asarray(rng.standard_normal((rows, h)).astype(np.float32)); host = cp.cuda.alloc_pinned_memory(one)
def best(f, k=5):
    ts = []
    for _ in range(k):
        cp.cuda.Device().synchronize(); t = time.perf_counter(); f(); cp.cuda.Device().synchronize(); ts.append(time.perf_counter() - t)
    return min(ts)
d2h = one / best(lambda: a.get()); h2d = one / best(lambda: cp.asarray(a.get()))
mm = 2 * rows * h * h / best(lambda: a @ ws[0].value)
print(f"one output {one/2**20:.0f} MiB; device->host {d2h/1e9:.1f} GB/s (pageable), host->device round trip {h2d/1e9:.1f} GB/s, matmul {mm/1e12:.1f} TFLOP/s")
steps = {"keep": offload.keep_step(layers, x), "recompute": offload.recompute_step(layers, x, 10 * one),
         "offload": offload.offload_step(layers, x)}
for way, step in steps.items():
    peak = offload.measure_step(step, repeats=0, device="gpu")["peak_bytes"]
    print(f"{way:10s} peak {peak/one:5.1f} outputs  step {best(step, 3)*1e3:8.1f} ms", flush=True)
PY
