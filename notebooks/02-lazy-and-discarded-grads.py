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
# # 2. Lazy and discarded gradients
#
# The live companion to `lectures/02-lazy-and-discarded-grads.md`. A chain of
# `x = ag.matmul(x, w)` layers, traced with `tracemalloc`, before and after the engine learns
# two things:
#
# - **lazy grads**: no grad buffer in forward; backward allocates one the first time
#   something flows into it, and only for tensors that lead to a `requires_grad=True` leaf;
# - **discarded grads**: an intermediate's grad is freed right after its own backward step,
#   and its value once no backward step left reads it.
#
# Then `ag.release_unneeded`, which frees in forward what no backward step will ever read.

# %%

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import demo

MB = ag.trace.MB


table, show = ag.tables.table, ag.plot.show  # the helpers every notebook uses


# %% [markdown]
# The lecture's sizes: weights of shape (1000, 1000) in float64; "before" runs 3 layers at
# batch 4000, "after" 5 layers at batch 4096 (a few seconds on a laptop).

# %%
WIDTH = 1000
BEFORE = dict(batch=4000, n_layers=3)
AFTER = dict(batch=4096, n_layers=5)

# %% [markdown]
# ## Forward: what each layer adds
#
# Before, `Tensor.__init__` did `self.grad = np.zeros_like(value)`: each layer's output costs
# its value *and* a grad of the same size, 2 × 4000 × 1000 × 8 B = 64 MB.
# `ag.eager_grads()` switches the engine back to that. After, a layer adds its value only,
# 4096 × 1000 × 8 B = 32.8 MB. (The weights were made before tracing started: not counted.)

# %%
before = demo.matmul_chain(BEFORE["batch"], BEFORE["n_layers"], eager=True, width=WIDTH)
after = demo.matmul_chain(AFTER["batch"], AFTER["n_layers"], eager=False, width=WIDTH)

rows = []
for k in range(max(len(before.forward), len(after.forward))):
    b = before.forward[k].allocated_mb if k < len(before.forward) else ""
    rows.append((k + 1, b, after.forward[k].allocated_mb))
table(("after layer", f"before MB (batch {BEFORE['batch']})", f"after MB (batch {AFTER['batch']})"), rows)

# %% [markdown]
# ## Backward: what each step leaves behind
#
# `loss = ag.sum(x)`, then `loss.backward(trace=True)` takes a snapshot after each backward
# step. Before, nothing is ever freed. After, the first step allocates the grad of the last
# output (one more 32.8 MB); then each matmul step frees its output's value and grad, makes
# its input's grad and one weight grad (8 MB): −24.6 MB a step, down to the weights' grads.
# (The two runs differ in batch and depth, as on the slides; the timeline below compares
# like with like.)

# %%
rows = []
for k in range(max(len(before.backward), len(after.backward))):
    b = before.backward[k] if k < len(before.backward) else None
    a = after.backward[k]
    rows.append((k + 1, b.op if b else "", b.allocated_mb if b else "", a.op, a.allocated_mb))
table(("step", "before op", "before MB", "after op", "after MB"), rows)
print()
print(f"peak of the whole run (tracemalloc): before {before.backward[-1].peak_bytes // MB} MB, "
      f"after {after.backward[-1].peak_bytes // MB} MB")
print(f"after ends with {AFTER['n_layers']} weight grads of {WIDTH * WIDTH * 8 // MB} MB each "
      f"= {AFTER['n_layers'] * WIDTH * WIDTH * 8 // MB} MB")

# %% [markdown]
# The rules, on a tiny graph: leaves keep their grad, an intermediate's grad is gone after
# backward (unless `retain_grad()`), and data that needs no grad never gets one.

# %%
x = ag.Tensor(np.ones((2, 3)))                                   # data
w = ag.Tensor(np.ones((3, 3)), requires_grad=True, name="w")     # a parameter
h = ag.matmul(x, w)
kept = ag.relu(h).retain_grad()
print("in forward, w.grad is", w.grad)
ag.sum(kept).backward()
print("after backward: w.grad", w.grad.shape, "| h.grad", h.grad, "| kept.grad", kept.grad.shape,
      "| x.grad", x.grad)

# %% [markdown]
# ## A timeline of one step
#
# `ag.trace.tracing()` records a labelled snapshot after every op and every backward step;
# `ag.plot.memory_timeline` draws them. Same chain, same sizes, eager against lazy grads
# (5 layers at batch 1000: 8 MB per activation).

# %%
def traced_chain(eager, batch=1000, n_layers=5, width=WIDTH, seed=0):
    """One forward and backward of x = ag.matmul(x, w) layers, every op recorded."""
    rng = np.random.default_rng(seed)
    with ag.eager_grads(eager):
        weights = [ag.Tensor(rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True)
                   for _ in range(n_layers)]
        x = ag.Tensor(rng.standard_normal((batch, width)))
        with ag.trace.tracing() as timeline:
            for w in weights:
                x = ag.matmul(x, w)
            loss = ag.sum(x)
            del x
            loss.backward()
    return timeline


timelines = {"eager grads (before)": traced_chain(eager=True),
             "lazy grads (after)": traced_chain(eager=False)}
table(("run", "ops + steps", "peak MB", "MB at the end"),
      [(name, len(t), max(s.peak_bytes for s in t) // MB, t[-1].allocated_mb)
       for name, t in timelines.items()])
show(ag.plot.memory_timeline(timelines, title="x = ag.matmul(x, w), 5 layers: one forward and backward"))

# %% [markdown]
# `ag.plot.memory_stack` splits the lazy run by what holds the bytes: ag's own count by
# category, under tracemalloc's line. Activations rise through forward and drain through
# backward, while the weights' grads accumulate.

# %%
show(ag.plot.memory_stack({"lazy grads (after)": timelines["lazy grads (after)"]},
                          title="What the memory holds (line: tracemalloc)"))

# %% [markdown]
# ## `release_unneeded`: free in forward what backward never reads
#
# In `ag.relu(h @ w + b)`, the product `h @ w` is read by no backward step (the add's gradient
# needs no values) and neither is the sum (relu's backward reads its *output*). The graph still
# holds both until backward, unless the block that made them releases them when it returns:
# `ag.release_unneeded([out], [h])` discards the values between `h` and `out` that no backward
# step reads, and returns the bytes freed.

# %%
def traced_mlp(release, batch=1000, n_layers=4, width=WIDTH, seed=0):
    """relu(h @ w + b) layers, optionally releasing each layer's unneeded intermediates."""
    rng = np.random.default_rng(seed)
    weights = [ag.Tensor(rng.standard_normal((width, width)) / np.sqrt(width), requires_grad=True)
               for _ in range(n_layers)]
    biases = [ag.Tensor(np.zeros(width), requires_grad=True) for _ in range(n_layers)]
    h = ag.Tensor(rng.standard_normal((batch, width)))
    freed = 0
    with ag.trace.tracing() as timeline:
        for w, b in zip(weights, biases):
            out = ag.relu(h @ w + b)
            if release:
                freed += ag.release_unneeded([out], [h])
            h = out
        end_of_forward = ag.trace.snapshot_trace()
        loss = ag.sum(h)
        del h, out
        loss.backward()
    return timeline, freed, end_of_forward


mlp = {}
rows = []
for release in (False, True):
    name = "release_unneeded" if release else "keep the graph's values"
    timeline, freed, end_of_forward = traced_mlp(release)
    mlp[name] = timeline
    rows.append((name, freed // MB, end_of_forward.allocated_mb, max(s.peak_bytes for s in timeline) // MB))
table(("forward", "freed MB", "MB at end of forward", "peak MB"), rows)

# %%
show(ag.plot.memory_timeline(mlp, title="relu(h @ w + b), 4 layers: one forward and backward"))
show(ag.plot.memory_stack(mlp, title="What the memory holds (line: tracemalloc)"))
