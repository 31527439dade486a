"""Attention's variants and decoding against torch SDPA: parts "variants" and "decode" of attention.py.

    python benchmarks/attention.py --skip sweep,time,memory,anatomy        # these two parts only
    python benchmarks/attention_variants.py --quick                        # the same, smaller

Variants (B = 1, H = 8, d = 64, float32, a forward + backward step of loss = sum(O ∘ dO)): ag's
``naive_attention`` and ``flash_attention`` on the classroom path, and flash in the lab (its runs of
heads on the threads), with each of FlashAttention's variants (flash's dropout redraws its mask
from the seed in backward), against torch SDPA where SDPA has it: the
window through a boolean ``attn_mask``, ALiBi through a float ``attn_mask``, dropout through
``dropout_p``, a value head dim of its own (dv = 128) as it is, packed sequences (``cu_seqlens``,
four of lengths N/8, 3N/8, N/8, 3N/8) through a block-diagonal ``attn_mask``; softcap, which SDPA
has not, against torch's eager S, tanh, softmax, P V. Then
dropout's memory: the mask naive's step keeps (tracemalloc) against the 8 bytes of a seed.

Decode (one query a sequence, GQA H = 32 over Hkv = 8, d = 128, float32): ``flash_decode`` against
torch SDPA on the same shapes, and each one's bandwidth: bytes of K and V read / time. A step does
4 · H · N · d flops on 2 · Hkv · N · d · 4 bytes: H / Hkv / 2 flops a byte, far below what a core
computes per byte it reads, so the step is bound by memory. The copy row is NumPy copying as
many bytes: the bandwidth a step could reach.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ag  # noqa: E402
from ag.attention import flash_attention, flash_attn_varlen, flash_decode, keep_mask, naive_attention  # noqa: E402
from _timing import take_turns  # noqa: E402
from mlp import classroom, in_lab, print_table  # noqa: E402

VARIANTS = {"window (256, 0)": dict(causal=True, window_size=(256, 0)), "softcap 30": dict(softcap=30.0),
            "alibi": dict(alibi_slopes=2.0 ** -np.arange(1, 9)), "dropout 0.1": dict(dropout_p=0.1, seed=1),
            "dv 128": dict(dv=128), "varlen, 4 seqs": dict(packed=True)}
H, D = 8, 64
DECODE_H, DECODE_H_KV, DECODE_D = 32, 8, 128


def torch_variant(torch, q, k, v, options: dict):
    """torch's O with the same variant: SDPA with a mask, a bias or dropout_p (dv of its own: as it is);
    softcap in eager ops."""
    f = torch.nn.functional
    n = q.shape[-2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if "window_size" in options:
        return f.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j >= i - options["window_size"][0]))
    if "alibi_slopes" in options:
        slopes = torch.tensor(options["alibi_slopes"], dtype=q.dtype)[:, None, None]
        return f.scaled_dot_product_attention(q, k, v, attn_mask=-slopes * (i - j).abs().to(q.dtype))
    if "dropout_p" in options:
        return f.scaled_dot_product_attention(q, k, v, dropout_p=options["dropout_p"])
    if "packed" in options:
        sequence = torch.from_numpy(np.repeat(np.arange(4), np.diff(cu_seqlens(n))))
        return f.scaled_dot_product_attention(q, k, v, attn_mask=sequence[:, None] == sequence[None, :])
    if "dv" in options:
        return f.scaled_dot_product_attention(q, k, v)
    cap = options["softcap"]
    s = torch.tanh(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5 * cap)) * cap
    return torch.softmax(s, dim=-1) @ v



def cu_seqlens(n: int) -> list[int]:
    """Four packed sequences of lengths N/8, 3N/8, N/8, 3N/8."""
    return [0, n // 8, n // 2, n // 2 + n // 8, n]


def variant_step(n: int, options: dict, framework: str):
    """A training step of loss = sum(O ∘ dO) with one variant, in ag ("naive", "flash") or torch."""
    rng = np.random.default_rng(0)
    dv = options.get("dv", D)
    q, k = (rng.standard_normal((1, H, n, D), dtype=np.float32) for _ in range(2))
    v, do = (rng.standard_normal((1, H, n, dv), dtype=np.float32) for _ in range(2))
    if framework in ("naive", "flash"):
        if "packed" in options:  # (H, total, d), as flash_attn_varlen packs them
            tensors = [ag.Tensor(x[0], requires_grad=True) for x in (q, k, v)]
            cu = cu_seqlens(n)
            return lambda: ag.sum(ag.mul(flash_attn_varlen(*tensors, cu, cu, attention=framework), do[0])).backward()
        attention = naive_attention if framework == "naive" else flash_attention
        ag_options = {key: value for key, value in options.items() if key != "dv"}
        tensors = [ag.Tensor(x, requires_grad=True) for x in (q, k, v)]
        return lambda: ag.sum(ag.mul(attention(*tensors, **ag_options), do)).backward()
    import torch
    tensors = [torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v)]
    return lambda: (torch_variant(torch, *tensors, options) * torch.from_numpy(do)).sum().backward()


def variant_table(sizes: list[int], repeats: int) -> None:
    rows = []
    for n in sizes:
        for name, options in VARIANTS.items():
            flash = variant_step(n, options, "flash")
            runs = {"naive": classroom(variant_step(n, options, "naive")), "flash": classroom(flash),
                    "lab": in_lab(flash), "torch": variant_step(n, options, "torch")}
            ms = {fw: 1e3 * statistics.median(ts) for fw, ts in take_turns(runs, repeats).items()}
            rows.append([str(n), name, *(f"{ms[fw]:.1f}" for fw in runs),
                         *(f"{ms[fw] / ms['torch']:.2f}" for fw in ("flash", "lab"))])
    print_table(f"Variants: a step (forward + backward), B = 1, H = {H}, d = {D}, float32, median ms; ag's on the "
                f"classroom path and flash's also in the lab ({ag.lab.workers()} workers; "
                "torch: SDPA with a mask, a bias or dropout_p; softcap: eager ops)",
                ["N", "variant", "ag naive", "ag flash", "ag lab", "torch", "flash / torch", "lab / torch"], rows)


def dropout_memory(n: int) -> None:
    """The bytes dropout's mask takes when stored (naive's step, tracemalloc) against a seed's 8."""
    rng = np.random.default_rng(0)
    q, k, v = (ag.Tensor(rng.standard_normal((1, H, n, D), dtype=np.float32), requires_grad=True) for _ in range(3))
    peaks = {}
    for p in (0.0, 0.1):
        tracemalloc.start()
        out = naive_attention(q, k, v, dropout_p=p, seed=1)
        peaks[p] = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del out
    mask_bytes = keep_mask(1, np.arange(H), np.arange(n), np.arange(n), 0.1).nbytes
    print(f"\ndropout at N = {n}: naive's graph after the forward holds {peaks[0.1] / 1e6:.1f} MB with dropout, "
          f"{peaks[0.0] / 1e6:.1f} MB without ({(peaks[0.1] - peaks[0.0]) / 1e6:.1f} MB more: the mask as float32 "
          f"scales and the dropped P, each B·H·N² · 4 bytes); as bools it is {mask_bytes / 1e6:.1f} MB (B·H·N² bytes); a seed is 8 bytes")


def decode_row(batch: int, n: int, splits: int | None, repeats: int) -> list[str]:
    import torch
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, DECODE_H, 1, DECODE_D), dtype=np.float32)
    k, v = (rng.standard_normal((batch, DECODE_H_KV, n, DECODE_D), dtype=np.float32) for _ in range(2))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    cache_bytes = k.nbytes + v.nbytes
    scratch = np.empty_like(k)
    runs = {"ag": lambda: flash_decode(q, k, v, num_splits=splits),
            "torch": lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True),
            "copy": lambda: (np.copyto(scratch, k), np.copyto(scratch, v))}
    times = {name: statistics.median(ts) for name, ts in take_turns(runs, repeats, settle=0.02).items()}
    flops = 4 * batch * DECODE_H * n * DECODE_D
    return [str(batch), str(n), str(splits or "default"), f"{flops / cache_bytes:.1f}",
            *(f"{1e3 * times[x]:.2f}" for x in ("ag", "torch")),
            *(f"{cache_bytes / times[x] / 1e9:.1f}" for x in ("ag", "torch", "copy"))]


def decode_table(cases: list[tuple[int, int, int | None]], repeats: int) -> None:
    rows = [decode_row(b, n, s, repeats) for b, n, s in cases]
    print_table(f"Decode: one query a sequence, H = {DECODE_H} over Hkv = {DECODE_H_KV} (GQA), d = {DECODE_D}, "
                "float32; GB/s = bytes of K and V / median time ('copy': NumPy copying them)",
                ["B", "N cache", "splits", "flop/byte", "ag ms", "torch ms", "ag GB/s", "torch GB/s", "copy GB/s"],
                rows)


def main(quick: bool = False) -> None:
    variant_table([512] if quick else [1024, 2048], 3 if quick else 5)
    dropout_memory(512 if quick else 1024)
    cases = [(1, 4096, None), (8, 4096, None), (8, 4096, 1), (8, 16384, None)]
    decode_table(cases[:2] if quick else cases, 5 if quick else 11)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="N = 512 for the variants, two decode shapes")
    main(parser.parse_args().quick)
