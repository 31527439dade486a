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
# # 1. The memory wall: what an array costs, and how to measure it
#
# The live companion to `lectures/01-memory-wall.md`. Every number on this page is measured
# when its cell runs: nothing is typed in by hand.
#
# - what a NumPy array costs: its data buffer, plus a header of about a hundred bytes;
# - `tracemalloc` sees NumPy's buffers, so we can count them: the slide's 16 MB and 8 MB;
# - a snapshot holds what is alive *now* and the *peak* since tracing started: a temporary
#   that is gone by the time we look still shows in the peak;
# - a training step as a timeline of snapshots.
#
# MB here is 10⁶ bytes, rounded down, as on the slides.

# %%
import sys

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import demo

N = 1000  # the lecture's (1000, 1000) arrays
MB = ag.trace.MB


table, show = ag.tables.table, ag.plot.show  # the helpers every notebook uses


# %% [markdown]
# ## What a NumPy array costs
#
# An array is a small Python object (the header: shape, strides, dtype, a pointer) and a data
# buffer of `size × itemsize` bytes. `nbytes` is the buffer; `sys.getsizeof` is the header plus
# the buffer the array owns.

# %%
nbytes, getsizeof = demo.array_cost(N)
print(f"float64 ({N}, {N}): nbytes = {nbytes:,} B, sys.getsizeof = {getsizeof:,} B, "
      f"header = {getsizeof - nbytes} B")

rows = []
for dtype in (np.float64, np.float32, np.float16, np.int8):
    a = np.zeros((N, N), dtype=dtype)
    rows.append((np.dtype(dtype).name, a.itemsize, f"{a.nbytes:,}", f"{sys.getsizeof(a):,}"))
table(("dtype", "itemsize", "nbytes", "getsizeof"), rows)

# %% [markdown]
# A view shares its base's buffer: `nbytes` reports the bytes it *spans*, but it costs only a
# header. Slicing, transposing and reshaping are free; arithmetic is not.

# %%
a = np.zeros((N, N))
views = {"a.T": a.T, "a[:500]": a[:500], "a.reshape(-1)": a.reshape(-1), "a[::2, ::2]": a[::2, ::2]}
table(("view", "nbytes", "getsizeof", "shares a's buffer"),
      [(name, f"{v.nbytes:,}", sys.getsizeof(v), np.shares_memory(v, a)) for name, v in views.items()])
del a, views

# %% [markdown]
# And a view pins its base: as long as one row of `a` is alive, all of `a` is.

# %%
ag.trace.start_trace()
a = np.zeros((N, N))
row = a[0]
del a
pinned = ag.trace.snapshot_trace()
ag.trace.end_trace()
print(f"row.nbytes = {row.nbytes:,} B, but alive: {pinned.allocated_bytes:,} B")
del row

# %% [markdown]
# ## Tracing NumPy with tracemalloc
#
# NumPy reports every data buffer it allocates to `tracemalloc`, in its own domain.
# `ag.trace` is the lecture's four functions around it: `start_trace`, `snapshot_trace`,
# `print_trace_stats`, `end_trace`. The slide:

# %%
ag.trace.start_trace()
a = 1.0 * np.zeros((N, N))
b = a * a
c = np.sum(b, axis=1)
stats = ag.trace.snapshot_trace()
ag.trace.print_trace_stats(stats)                        # a and b: 8 MB each; c: 8 kB
b = None
ag.trace.print_trace_stats(ag.trace.snapshot_trace())   # b's buffer went back when its last name did
ag.trace.end_trace()
print(f"exactly {stats.allocated_bytes:,} bytes: 2 x {a.nbytes:,} + {c.nbytes:,}")
assert stats.allocated_bytes == 2 * a.nbytes + c.nbytes
del a, c

# %% [markdown]
# `ag.demo.numpy_trace` runs the same lines in a function; `ag demo memory` prints them.

# %%
ag.trace.print_trace_stats(demo.numpy_trace(N))
ag.trace.print_trace_stats(demo.numpy_trace(N, drop_b=True))

# %% [markdown]
# ## Snapshots: what is alive now, and the peak
#
# A `Snapshot` carries `allocated_bytes` (NumPy buffers alive now, allocated since
# `start_trace`) and `peak_bytes` (tracemalloc's high-water mark since `start_trace`).
# First the slide's lines, one snapshot after each:

# %%
def traced(lines):
    """Run the statements in one namespace, with a snapshot labelled by each after it runs."""
    namespace = {"np": np, "N": N}
    ag.trace.start_trace()
    try:
        snapshots = []
        for line in lines:
            exec(line, namespace)
            snapshots.append(ag.trace.snapshot_trace(op=line))
        return snapshots
    finally:
        ag.trace.end_trace()


slide = traced(["a = 1.0 * np.zeros((N, N))", "b = a * a", "c = np.sum(b, axis=1)", "b = None"])
table(("after", "allocated MB", "peak MB"),
      [(s.op, f"{s.allocated_bytes / MB:.3f}", f"{s.peak_bytes / MB:.3f}") for s in slide])

# %% [markdown]
# The peak catches what no snapshot saw. Here `a * a` is a temporary: it lives only inside the
# expression and is gone before we look, but for a moment it held 8 MB more.

# %%
temporary = traced(["a = 1.0 * np.zeros((N, N))", "c = np.sum(a * a, axis=1)"])
table(("after", "allocated MB", "peak MB"),
      [(s.op, f"{s.allocated_bytes / MB:.3f}", f"{s.peak_bytes / MB:.3f}") for s in temporary])

# %% [markdown]
# The peak never comes down within a trace: it is the number that decides whether a program
# fits. (Besides NumPy's buffers it counts every Python allocation: the few kB above 16 MB.)

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True,
                         gridspec_kw={"width_ratios": [len(slide), len(temporary)]})
for ax, snapshots, title in ((axes[0], slide, "the slide"), (axes[1], temporary, "a temporary")):
    steps = np.arange(len(snapshots))
    ax.bar(steps - 0.2, [s.allocated_bytes / MB for s in snapshots], width=0.4, label="allocated now")
    ax.bar(steps + 0.2, [s.peak_bytes / MB for s in snapshots], width=0.4, label="peak so far")
    ax.set_xticks(steps, [s.op for s in snapshots], rotation=15, ha="right", fontsize=8)
    ax.set_title(title)
axes[0].set_ylabel("MB")
axes[0].legend()
fig.suptitle("NumPy memory after each line (tracemalloc)")
fig.tight_layout()
show(fig)

# %% [markdown]
# ## A training step as a timeline
#
# `ag.trace.tracing()` takes a labelled snapshot after every op and every backward step of ag.
# One linear layer with a ReLU, batch 4096, float64: each forward op adds one 4096 × 1000
# array (32.8 MB); backward frees what nothing reads any more and ends with `w.grad` and
# `b.grad`. Why it frees exactly that is `lectures/02-lazy-and-discarded-grads.md`.

# %%
rng = np.random.default_rng(0)
x = ag.Tensor(rng.standard_normal((4096, N)))                  # data: never gets a grad
w = ag.Tensor(rng.standard_normal((N, N)), requires_grad=True)
b = ag.Tensor(np.zeros(N), requires_grad=True)
with ag.trace.tracing() as timeline:
    ag.mean(ag.relu(x @ w + b)).backward()
table(("after", "allocated MB", "peak MB"), [(s.label, s.allocated_mb, s.peak_bytes // MB) for s in timeline])

# %% [markdown]
# The peak jumps by 4 MB in the `relu` step, where no snapshot looks: the boolean mask
# `out.value > 0`, one byte per element.

# %%
show(ag.plot.memory_timeline({"mean(relu(x @ w + b))": timeline}, title="One training step, op by op"))
