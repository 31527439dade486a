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
# # 6. Rematerialization on any graph: Checkmate, revolve and DTR
#
# The live companion to `lectures/06-remat-on-graphs.md`. We capture training steps as graphs,
# write schedules as Checkmate's R and S matrices, ask HiGHS for the optimal one, compare it
# with NeMo's selective recomputation on a transformer layer, run DTR with no plan, and watch
# revolve move its checkpoints. Every peak below is measured by running the schedule on the
# engine (tracemalloc), next to what the memory model predicted. Needs the `solver` extra.

# %%
import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import memory_model, nn, remat
from ag.remat import examples

MB = ag.trace.MB
table, show = ag.tables.table, ag.plot.show

# %% [markdown]
# ## A step as a graph
#
# A U-Net-like net: down 128 → 64 → 32, up again, each up level adding the down level of its
# size. The arcs are edges; the two long ones are the skip connections.

# %%
fn, inputs = examples.unet()
unet = remat.capture(fn, *inputs)
print(unet.summary())
show(unet.draw().figure)

# %% [markdown]
# ## Schedules, predicted and measured
#
# The fixed plans of note 3 on this graph, as schedules, each run by `remat.execute`.

# %%
rows = []
for schedule in [remat.chain_schedule(unet, s) for s in ("keep all", "sqrt", "keep none")]:
    result = remat.execute(schedule)
    rows.append((schedule.planner, f"{schedule.predicted_peak_bytes / MB:.3f}", f"{result.peak_bytes / MB:.3f}",
                 f"{result.recompute_flops:,}"))
table(("plan", "predicted MB", "measured MB", "recomputed FLOPs"), rows)

# %% [markdown]
# ## The optimal schedule at a tight budget
#
# Half-way between the smallest feasible bound and the no-recompute peak. Dark cells are
# computations (R), light ones values kept into a stage (S); the red line is where backward starts.

# %%
none = remat.chain_schedule(unet, "keep all")
budget = (remat.lower_bound_bytes(unet) + none.predicted_peak_bytes) // 2
best = remat.checkmate(unet, budget, time_limit=20)
print(best, f"gap {best.gap:.0%}")
print("measured:", remat.execute(best))
show(best.draw().figure)

# %% [markdown]
# ## The lecture's answer: Checkmate at selective recomputation's budget
#
# A float16 transformer layer. NeMo's selective recomputation drops the attention core; give
# the solver the same peak and see what it drops.

# %%
s, b, h, a = 128, 2, 64, 4
model = nn.TransformerLayer(h, a, dtype=np.float16, dropout=0.1)
x = ag.Tensor(np.random.default_rng(0).standard_normal((s, b, h)).astype(np.float16), requires_grad=True)
layer = remat.capture(lambda x: ag.sum(model(x)), x)
selective = remat.nemo(layer, "selective")
found = remat.checkmate(layer, selective.predicted_peak_bytes)
print(f"selective recomputes {selective.recompute_flops:,} FLOPs, checkmate {found.recompute_flops:,} ({found.status})")
table(("node", "op", "FLOPs", "made in"),
      [(i, layer.nodes[i].op, f"{layer.nodes[i].flops:,}", layer.nodes[i].scope[-1].split("@")[0])
       for i in found.recomputed()])

# %% [markdown]
# ## DTR: no plan, evict at run time
#
# The same U-Net at shrinking budgets, with the exact evicted neighbourhood (`dtr`) and the
# union-find approximation (`dtr_eq`), against the optimum at each budget.

# %%
rows = []
for share in (1.0, 0.85, 0.7):
    budget = int(share * none.predicted_peak_bytes)
    runs = [remat.dynamic(unet, budget, heuristic=hr) for hr in ("dtr", "dtr_eq")]
    optimum = remat.checkmate(unet, max(budget, remat.lower_bound_bytes(unet)), time_limit=20)
    rows.append((f"{budget / MB:.2f}", *(f"{r.recompute_flops:,}" for r in runs), f"{optimum.recompute_flops:,}"))
table(("budget MB", "DTR", "DTR (eq. classes)", "checkmate"), rows)

# %% [markdown]
# ## Revolve against one-level plans
#
# Layer forwards to reverse a chain of 30 layers: revolve's binomial schedule against the best
# plan that never moves its checkpoints.

# %%
slots = range(0, 9)
plt.figure(figsize=(6, 3.5))
plt.plot(slots, [remat.revolve(30, k).forwards for k in slots], "o-", label="revolve")
plt.plot(slots, [remat.one_level_forwards(30, k) for k in slots], "s--", label="best one-level plan")
plt.xlabel("checkpoint slots")
plt.ylabel("layer forwards")
plt.legend()
plt.title("30 layers: forwards against slots")
show(plt.gcf())

# %% [markdown]
# And run on the engine: a chain of 8 matmuls, revolve with 2 slots, through `execute`.

# %%
rng = np.random.default_rng(0)
chain_x = ag.Tensor(rng.standard_normal((2048, 64)).astype(np.float32))
chain_w = [ag.Tensor((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), requires_grad=True) for _ in range(8)]


def chain(x):
    for w in chain_w:
        x = x @ w
    return ag.sum(x)


chain_graph = remat.capture(chain, chain_x)
plan = remat.revolve(8, 2)
run = remat.execute(plan.schedule(chain_graph))
print(plan.actions[:12], "...")
print(f"{plan.forwards} layer forwards; recomputed FLOPs {run.recompute_flops:,} = "
      f"{plan.recomputed} × {chain_graph.nodes[0].flops:,}")

# %% [markdown]
# ## Every planner on one chart (Checkmate's Figure 4)
#
# `ag demo remat --graph` does this for three graphs at five budgets; here one graph, three
# budgets, short time limits.

# %%
from ag.remat.graphs.sweep import budgets_between, sweep  # noqa: E402

points = sweep(unet, budgets_between(unet, 3), time_limit=5)
show(ag.plot.remat_frontier({"U-Net": points}, {"U-Net": unet.forward_flops}))
