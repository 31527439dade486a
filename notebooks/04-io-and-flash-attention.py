# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 4. IO and FlashAttention
#
# The live companion to `lectures/04-io-and-flash-attention.md`. Standard attention writes
# S = QKᵀ and P = softmax(S), two N×N arrays, to memory and reads them back; FlashAttention
# never holds either. It streams tiles of K and V past a tile of Q, and the one piece of
# algebra that makes this possible is merging two softmaxes from their results alone.
#
# - the online softmax: two blocks merged, then a whole row block by block;
# - `flash_attention` against `naive_attention`: the same outputs and gradients;
# - peak memory against N: ×4 per doubling for naive, ×2 for flash;
# - what the tile size trades: memory per tile against passes over K and V.

# %%

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import demo
from ag.attention import (DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, flash_attention, merge_softmax_blocks,
                          naive_attention, online_softmax, softmax_block)

MB = ag.trace.MB


table, show = ag.tables.table, ag.plot.show  # the helpers every notebook uses


def softmax_then_v(s, v):
    """softmax(s) @ v the standard way: the whole row of P at once."""
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


# %% [markdown]
# ## Online softmax: merging two blocks
#
# One row of scores `s` (8 keys) and the values `v` of those keys, cut into two blocks of 4.
# Each block keeps its output `o = softmax(s_block) @ v_block`, its max `m` and its normalizer
# `l = Σ exp(s - m)`. The merge rescales both normalizers to the common max,
# `n1 = e^(m_a - m) l_a` and `n2 = e^(m_b - m) l_b`, and weighs each block's output by its share:
# `o = n1/(n1+n2) o_a + n2/(n1+n2) o_b`.

# %%
rng = np.random.default_rng(0)
s = 3 * rng.standard_normal((1, 8))
v = rng.standard_normal((8, 4))
a = softmax_block(s[:, :4], v[:4])
b = softmax_block(s[:, 4:], v[4:])
merged = merge_softmax_blocks(a, b)

m = max(a.m.item(), b.m.item())
n1, n2 = np.exp(a.m.item() - m) * a.l.item(), np.exp(b.m.item() - m) * b.l.item()
table(("block", "m", "l", "share of the normalizer", "o[:2]"),
      [("a: keys 0..3", f"{a.m.item():.3f}", f"{a.l.item():.3f}", f"n1/(n1+n2) = {n1 / (n1 + n2):.3f}",
        np.round(a.o[0, :2], 3)),
       ("b: keys 4..7", f"{b.m.item():.3f}", f"{b.l.item():.3f}", f"n2/(n1+n2) = {n2 / (n1 + n2):.3f}",
        np.round(b.o[0, :2], 3)),
       ("merged", f"{merged.m.item():.3f}", f"{merged.l.item():.3f}", "", np.round(merged.o[0, :2], 3))])
by_hand = (n1 * a.o + n2 * b.o) / (n1 + n2)
print("max |merged - softmax(s) @ v| =", np.abs(merged.o - softmax_then_v(s, v)).max())
print("max |by hand - merged|        =", np.abs(by_hand - merged.o).max())

# %% [markdown]
# The max is what keeps `exp` finite: logits of size 10⁴ overflow `np.exp` at once, but every
# block subtracts its own max, and the merge only ever exponentiates differences of maxes.

# %%
big = 1e4 * s
with np.errstate(over="ignore", invalid="ignore"):
    unshifted = np.exp(big) / np.exp(big).sum()
print("np.exp without the max gives:", unshifted[0, :4], "...")
merged_big = merge_softmax_blocks(softmax_block(big[:, :4], v[:4]), softmax_block(big[:, 4:], v[4:]))
print("max |merged - softmax(s) @ v| at 1e4 logits =", np.abs(merged_big.o - softmax_then_v(big, v)).max())

# %% [markdown]
# `online_softmax` folds the merge over a whole row of blocks, never holding a row of P:
# the block size changes nothing but rounding.

# %%
S = 4 * rng.standard_normal((256, 1024))
V = rng.standard_normal((1024, 64))
exact = softmax_then_v(S, V)
table(("block size", "blocks per row", "max |error|"),
      [(size, 1024 // size, f"{np.abs(online_softmax(S, V, size)[0] - exact).max():.1e}")
       for size in (1, 16, 128, 1024)])

# %% [markdown]
# ## FlashAttention equals standard attention
#
# `naive_attention` builds S and P with ag ops and differentiates through the engine;
# `flash_attention` follows FlashAttention-2: query tiles outside, key/value tiles inside,
# only O and the logsumexp saved, P recomputed tile by tile in backward. Float64, 4 query heads
# sharing 2 key/value heads (GQA), N = 256, d = 64, tiles of 64 × 64 (4 × 4 tiles per head).

# %%
q0 = rng.standard_normal((1, 4, 256, 64))
k0, v0 = rng.standard_normal((1, 2, 256, 64)), rng.standard_normal((1, 2, 256, 64))
d_out = rng.standard_normal(q0.shape)  # the gradient arriving at O


def run(attention, causal, **tiles):
    """Output and gradients of ``attention``, with ``d_out`` as the gradient of O."""
    q, k, v = (ag.Tensor(x.copy(), requires_grad=True) for x in (q0, k0, v0))
    o = attention(q, k, v, causal=causal, **tiles)
    o.backward(d_out)
    return o.value, q.grad, k.grad, v.grad


rows = []
for causal in (False, True):
    naive, flash = run(naive_attention, causal), run(flash_attention, causal, block_q=64, block_k=64)
    errors = [np.abs(x - y).max() for x, y in zip(naive, flash)]
    assert max(errors) < 1e-12
    rows.append((causal, *(f"{e:.1e}" for e in errors)))
table(("causal", "max |ΔO|", "max |ΔdQ|", "max |ΔdK|", "max |ΔdV|"), rows)

# %% [markdown]
# ## Memory against sequence length
#
# `ag.demo.attention_scaling` measures tracemalloc's peak over one forward and backward, one
# head, d = 64, float32. Naive holds S and P and their grads: quadratic. Flash holds Q, K, V,
# O, their grads, the logsumexp and one tile: linear. (`ag demo attention` goes to N = 16384.)

# %%
scaling = demo.attention_scaling(sizes=(256, 512, 1024, 2048), naive_up_to=2048)
rows, previous = [], None
for r in scaling:
    growth = ("", "") if previous is None else (f"x{r.naive_bytes / previous.naive_bytes:.1f}",
                                                 f"x{r.flash_bytes / previous.flash_bytes:.1f}")
    rows.append((r.n, f"{r.naive_bytes / MB:.1f}", growth[0], f"{r.flash_bytes / MB:.2f}", growth[1],
                 f"{r.naive_bytes / r.flash_bytes:.1f}", f"{r.n * r.n * 4 / MB:.1f}"))
    previous = r
table(("N", "naive MB", "growth", "flash MB", "growth", "naive/flash", "one N x N float32 MB"), rows)

# %% [markdown]
# At small N the fixed costs (Q, K, V, O and their grads, N·d each) hide the slopes; the
# doublings approach ×4 and ×2 as N grows. Dotted lines: slopes N and N² through the first point.

# %%
show(ag.plot.scaling({"naive": [(r.n, r.naive_bytes) for r in scaling],
                      "flash": [(r.n, r.flash_bytes) for r in scaling]},
                     title="Attention: peak memory of forward + backward"))

# %% [markdown]
# ## What the tile size trades
#
# On a GPU a tile of Q, K, V and S must fit in on-chip SRAM; the rest lives in HBM. A query
# tile of `block_q` rows reads every tile of K and V once, so the forward pass streams K and V
# from HBM `⌈N / block_q⌉` times: bigger tiles mean less IO, but more memory per tile. Here,
# N = 1024: the measured peak (tracemalloc, forward + backward) and the K, V bytes the forward
# loop reads (counted from the loop, not measured). One tile of 1024 × 1024 is standard
# attention again: S in one piece.

# %%
N, D = 1024, 64
q1, k1, v1 = (rng.standard_normal((1, 1, N, D)).astype(np.float32) for _ in range(3))


def flash_peak(block_q, block_k):
    """tracemalloc peak of one flash forward + backward with these tiles."""
    q, k, v = (ag.Tensor(x, requires_grad=True) for x in (q1, k1, v1))
    ag.trace.start_trace()
    try:
        o = flash_attention(q, k, v, block_q=block_q, block_k=block_k)
        o.backward(np.ones(o.shape, dtype=np.float32))
        peak = ag.trace.snapshot_trace().peak_bytes
    finally:
        ag.trace.end_trace()
    return peak


tiles = [(32, 32), (64, 64), (128, 128), (128, 256), (256, 256), (512, 512), (1024, 1024)]
tile_runs = []
for block_q, block_k in tiles:
    kv_read = -(-N // block_q) * 2 * N * D * 4  # ⌈N / block_q⌉ passes over K and V, float32
    tile_runs.append((block_q, block_k, flash_peak(block_q, block_k), kv_read))
table(("block_q x block_k", "one S tile MB", "peak MB", "K, V read by forward MB"),
      [(f"{bq} x {bk}" + (" (default)" if (bq, bk) == (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K) else ""), f"{bq * bk * 4 / MB:.2f}",
        f"{peak / MB:.1f}", f"{kv / MB:.1f}") for bq, bk, peak, kv in tile_runs])

# %% [markdown]
# Up to 128 × 128 a tile is small next to Q, K, V, O and their grads (0.26 MB each), and the
# peak does not move, while the IO halves with every doubling of `block_q`. From there a tile's
# arrays (S, P and, in backward, their grads) show in the peak, and past the default 256 × 256
# (chosen for speed: BLAS likes bigger tiles) they set it.

# %%
fig, ax = plt.subplots(figsize=(7, 4.2))
labels = [f"{bq}x{bk}" for bq, bk, *_ in tile_runs]
ax.plot(labels, [r[2] / MB for r in tile_runs], marker="o", color="C0", label="peak memory (measured)")
ax.set_ylabel("peak memory (MB)", color="C0")
ax.set_xlabel("tile: block_q x block_k")
io_ax = ax.twinx()
io_ax.plot(labels, [r[3] / MB for r in tile_runs], marker="s", color="C1",
           label="K, V read by forward (counted)")
io_ax.set_ylabel("K, V read by the forward loop (MB)", color="C1")
ax.set_title(f"Flash attention, N = {N}: memory per tile against passes over K and V")
fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.88))
fig.tight_layout()
show(fig)
