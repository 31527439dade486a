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
# # 3. Rematerialization: trading matmuls for memory
#
# The live companion to `lectures/03-rematerialization.md`. A tensor with a `rematerializer`
# is not a checkpoint: the engine drops its value as soon as the op that consumed it has run,
# calls the rematerializer (under `no_grad`) when a backward step reads it, and drops it again
# after the last step that reads it.
#
# First the lecture's loop, written with nothing but `ag.Tensor`, `ag.matmul` and a closure;
# then what it costs in products (`ag.count_ops`) and bytes (`ag.trace.tracing`); then every
# strategy of `ag.remat` on the same chain.

# %%

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import demo, remat

MB = ag.trace.MB


table, show = ag.tables.table, ag.plot.show  # the helpers every notebook uses


# %% [markdown]
# The lecture's chain has 10 layers `x = ag.matmul(x, w)`. Small sizes keep this page fast
# (the lecture's are batch 512 and width 1000: `ag demo remat`); float64 so that gradients
# can be compared exactly.

# %%
N_LAYERS, BATCH, WIDTH = 10, 256, 256
rng = np.random.default_rng(0)
weights = [ag.Tensor(rng.standard_normal((WIDTH, WIDTH)) / np.sqrt(WIDTH), requires_grad=True, name=f"w{i}")
           for i in range(N_LAYERS)]
x = ag.Tensor(rng.standard_normal((BATCH, WIDTH)), name="x")
print(f"each activation: {BATCH} x {WIDTH} float64 = {BATCH * WIDTH * 8 / MB:.1f} MB")

# %% [markdown]
# ## The rematerializer loop
#
# Indices follow the loop: `x_i` is the output of iteration `i` (after `weights[i]`), and
# `checkpoints=[5]` keeps `x_5`; the input, `x_{-1}`, is always kept. Every other output gets a
# `_rematerializer` that starts from the farthest checkpoint below it, `x_c`, and replays
# layers `c+1 .. i`: the slice is `weights[farthest_checkpoint + 1:(i + 1)]`.

# %%
def forward(x, weights, checkpoints, slide_slice=False):
    """x = ag.matmul(x, w) for every weight; outputs not in ``checkpoints`` are recomputed in backward."""
    kept = {-1: x}  # output index -> kept Tensor; -1 is the input
    for i, w in enumerate(weights):
        farthest_checkpoint = max(kept)  # the last output kept before this one

        def _rematerializer(i=i, farthest_checkpoint=farthest_checkpoint):  # defaults freeze this i
            h = kept[farthest_checkpoint]
            first = farthest_checkpoint if slide_slice else farthest_checkpoint + 1
            for w in weights[max(first, 0):(i + 1)]:  # max: the slide's start is -1 for the input
                h = ag.matmul(h, w)
            return h

        x = ag.matmul(x, w)
        if i in checkpoints:
            kept[i] = x
        else:
            x.rematerializer = _rematerializer
    return x


def gradients(run):
    """Zero the weights' grads, backpropagate sum(run()) and return copies of the grads."""
    for w in weights:
        w.zero_grad()
    ag.sum(run()).backward()
    return [w.grad.copy() for w in weights]


reference = gradients(lambda: forward(x, weights, checkpoints=range(N_LAYERS)))  # keep everything
correct = gradients(lambda: forward(x, weights, checkpoints=[5]))
slide = gradients(lambda: forward(x, weights, checkpoints=[5], slide_slice=True))

table(("weight", "its input", "max |error|, weights[c + 1:(i + 1)]", "max |error|, weights[c:(i + 1)]"),
      [(f"w{k}", "x (input)" if k == 0 else f"x_{k - 1}" + (" (kept)" if k - 1 == 5 else ""),
        f"{np.abs(correct[k] - reference[k]).max():.1e}", f"{np.abs(slide[k] - reference[k]).max():.1e}")
       for k in range(N_LAYERS)])
assert all(np.array_equal(c, r) for c, r in zip(correct, reference))  # bit-identical

# %% [markdown]
# Recomputing gives gradients bit-identical to keeping everything: the same products on the
# same inputs. The slide's slice `weights[farthest_checkpoint:(i + 1)]` starts at the
# checkpoint's own weight, which `x_5` has already absorbed: `x_6` comes back as
# `x_5 · w5 · w6`. The grads of `w7`, `w8`, `w9` (which read `x_6 .. x_8`) are wrong, and
# nothing fails: with square weights every replay has the right shape, so the engine's check
# (`rematerialize` compares shape and dtype) cannot see it. Compare against a run without
# rematerialization whenever you write a rematerializer.
#
# A second trap hides in the sentinel: the input is checkpoint `-1`, and Python reads a slice
# that starts at `-1` from the *end* of the list. Hence the `max(first, 0)` above.

# %%
names = [f"w{k}" for k in range(N_LAYERS)]
farthest_checkpoint = -1
for i in (2, 9):
    print(f"i = {i}: weights[farthest_checkpoint + 1:(i + 1)] = {names[farthest_checkpoint + 1:(i + 1)]}, "
          f"weights[farthest_checkpoint:(i + 1)] = {names[farthest_checkpoint:(i + 1)]}")

# %% [markdown]
# ## What it costs: products and bytes
#
# `ag.count_ops()` counts every matrix product by phase. Without rematerialization: 10 forward
# and 19 backward, because the input is data and layer 0 computes only its weight's grad. The
# lecture's input requires a grad, which adds one product: 30. Recomputing `x_i` from the
# input costs `i + 1` products.

# %%
def measure(run):
    """The timeline (tracemalloc) and products by phase of one forward and backward of ``run()``.

    The weights' grads exist already, as in every training step after the first.
    """
    with ag.trace.tracing() as timeline, ag.count_ops() as counts:
        ag.sum(run()).backward()
    return timeline, counts


layers = [lambda h, w=w: ag.matmul(h, w) for w in weights]
x_with_grad = ag.Tensor(x.value, requires_grad=True)  # as on the slide
runs = {
    "lecture loop, keep all": lambda: forward(x, weights, checkpoints=range(N_LAYERS)),
    "lecture loop, [5]": lambda: forward(x, weights, checkpoints=[5]),
    "lecture loop, []": lambda: forward(x, weights, checkpoints=[]),
    "keep all, input needs grad": lambda: forward(x_with_grad, weights, checkpoints=range(N_LAYERS)),
    "[], input needs grad": lambda: forward(x_with_grad, weights, checkpoints=[]),
    "remat.sequential [5], tensor": lambda: remat.sequential(layers, x, [5], mode="tensor"),
    "remat.sequential [5], segment": lambda: remat.sequential(layers, x, [5], mode="segment"),
}
measured = {name: measure(run) for name, run in runs.items()}
rows = []
for name, (timeline, counts) in measured.items():
    m = counts.matmuls
    rows.append((name, m["forward"], m["recompute"], m["backward"], counts.total_matmuls,
                 f"{max(s.peak_bytes for s in timeline) / MB:.1f}"))
table(("run", "forward", "recompute", "backward", "total", "peak MB"), rows)
recomputed = measured["lecture loop, []"][1].matmuls["recompute"]
assert recomputed == sum(i + 1 for i in range(N_LAYERS - 1))  # x_i costs i + 1, for x_0 .. x_{n-2}

# %% [markdown]
# With `[5]`, the outputs backward reads are `x_0 .. x_8` (`x_9` feeds only the sum, which
# reads no value): `x_0 .. x_4` cost 1 + 2 + 3 + 4 + 5 = 15 products from the input and
# `x_6 .. x_8` cost 1 + 2 + 3 = 6 from `x_5`, 21 in all; with no checkpoint, 1 + ... + 9 = 45.
# `ag.remat.sequential(mode="tensor")` is the same per-tensor recompute; `mode="segment"`
# (Chen et al.) replays each run of layers once and keeps what backward will read: 5 + 3 = 8.
#
# In the timeline, the loop with `[5]` ends one activation above `ag.remat`'s `[5]`: the
# loop's `kept` dict (which every closure shares) holds `x_5` to the end, while `ag.remat`
# holds checkpoints weakly, so `x_5` goes as soon as backward is past the layer that reads it.

# %%
show(ag.plot.memory_timeline({name: timeline for name, (timeline, _) in measured.items()
                              if "input needs grad" not in name},
                             title="Memory over one step: the lecture's loop and ag.remat"))

# %% [markdown]
# ## Every strategy of `ag.remat`
#
# `ag.demo.remat_strategies` runs each plan on a chain of `ag.matmul` layers (float32) and
# measures its peak, its products by phase and its time; `predict` is `ag.remat.predict`,
# which counts activations and their grads (the measured peak also holds one weight's grad in
# flight). `greedy` and `optimal` get the budget of `sqrt`'s predicted peak.

# %%
strategies = demo.remat_strategies(n_layers=N_LAYERS, batch=BATCH, width=WIDTH)
rows = []
for r in strategies:
    m = r.counts.matmuls
    rows.append((r.strategy, str(r.checkpoints), r.mode, f"{r.peak_bytes / MB:.2f}",
                 f"{r.predicted_peak_bytes / MB:.2f}", m["forward"], m["recompute"], m["backward"],
                 f"{r.seconds * 1e3:.1f}"))
table(("strategy", "kept outputs", "mode", "peak MB", "predict MB", "fwd", "recomp", "bwd", "ms"), rows)

# %%
timelines = {r.strategy: r.timeline for r in strategies}
show(ag.plot.memory_timeline(timelines, title="Memory over one training step, by strategy"))

# %% [markdown]
# What the memory holds, by ag's own count: kept activations, activations that were
# recomputed, and gradients, under tracemalloc's line.

# %%
show(ag.plot.memory_stack(timelines, title="What the memory holds, by strategy (line: tracemalloc)"))

# %% [markdown]
# Every plan is a point: peak memory against recomputed FLOPs. The dashed line is the Pareto
# front: the plans no other plan beats on both.

# %%
show(ag.plot.tradeoff({r.strategy: (r.peak_bytes, r.counts.flops["recompute"]) for r in strategies},
                      title="Peak memory against recomputation"))
