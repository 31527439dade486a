"""The float32 forward kernel's key tile against torch SDPA: which BLOCK_K each head dim should use.

    python benchmarks/gpu_fwd_tiles.py                  # d = 64 and 128, BLOCK_K = 16, 32, 64, N = 2048 and 4096
    python benchmarks/gpu_fwd_tiles.py --d 128 --block-k 32 64

flash_fwd.cu is compiled once per (d, BLOCK_K) with -DFWD_BLOCK_K; each build's O is checked against
the default build's, and its registers, shared memory and blocks an SM (CUDA's occupancy calculator)
are printed beside its TFLOP/s and the ratio to torch's float32 SDPA on the same inputs in the same run
(B = 4, H = 16, 4·B·H·N²·d flops, halved when causal).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ag.attention import gpu  # noqa: E402
from gpu_attention import B, H, Inputs, flops, seconds_per_call  # noqa: E402

THREADS = gpu.THREADS["flash_fwd_f32"]  # the launch the kernel is built for


def build(d: int, block_k: int):
    """(kernel, shared bytes, registers, blocks an SM) of flash_fwd.cu built with FWD_BLOCK_K = block_k."""
    import cupy as cp
    module = cp.RawModule(code=gpu.kernel_code("flash_fwd"),
                          options=("-std=c++17", f"-DHEAD_DIM={d}", f"-DFWD_BLOCK_K={block_k}"))
    kernel = module.get_function("flash_fwd_f32")
    smem = int(cp.ndarray((), cp.int32, module.get_global("flash_fwd_f32_smem")).get())
    kernel.max_dynamic_shared_size_bytes = smem
    try:  # CUDA's occupancy calculator
        blocks = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, THREADS, smem)
    except Exception:  # by hand: 64K registers and 228 KB of shared memory (1 KB of it reserved a block) an SM
        blocks = min(65536 // (THREADS * kernel.num_regs), 228 * 1024 // (smem + 1024))
    return kernel, smem, kernel.num_regs, blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--block-k", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--n", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    import cupy as cp
    import torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print("| d | BLOCK_K | regs | smem KB | blocks/SM | mask | N | ag TFLOP/s | torch fp32 | ratio | max |ΔO| vs default |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for d in args.d:
        for n in args.n:
            x = Inputs(n, d)
            tq, tk, tv = (torch.from_dlpack(a) for a in (x.q, x.k, x.v))
            for causal in (False, True):
                torch_rate = flops(n, d, causal) / seconds_per_call(lambda: sdpa(tq, tk, tv, is_causal=causal),
                                                                    args.trials, torch) / 1e12
                reference, _ = gpu.forward(x.q, x.k, x.v, causal=causal)
                launch = gpu._plan(x.q, x.k, x.v, causal, None, ("float32",))
                for block_k in args.block_k:
                    kernel, smem, regs, blocks = build(d, block_k)
                    o, lse = cp.empty_like(x.q), cp.empty(x.q.shape[:-1], cp.float32)
                    call = lambda: kernel(launch.query_grid(), (THREADS,), (x.q, x.k, x.v, o, lse) + launch.args(),
                                          shared_mem=smem)
                    rate = flops(n, d, causal) / seconds_per_call(call, args.trials) / 1e12
                    diff = float(cp.abs(o - reference).max())
                    print(f"| {d} | {block_k} | {regs} | {smem / 1024:.1f} | {blocks} | {'causal' if causal else 'full'} "
                          f"| {n} | {rate:.1f} | {torch_rate:.1f} | {rate / torch_rate:.2f} | {diff:.1e} |", flush=True)
            del x, tq, tk, tv
            cp.get_default_memory_pool().free_all_blocks()
    print(f"B = {B}, H = {H}; {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
