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
# # 5. Activation memory of a transformer layer
#
# The live companion to `lectures/05-transformer-activation-memory.md`. One pre-LN transformer
# layer keeps sbh(34 + 5as/h) bytes for backward with 16-bit values and 1-byte dropout masks
# (Korthikanti et al. 2022). `ag.nn.TransformerLayer` keeps exactly that, so every formula can be
# checked against a measurement, to the byte.
#
# - measured against predicted, for every recomputation setting (`ag demo transformer`'s table);
# - what the bytes are made of, tensor by tensor, with and without parallelism;
# - when the attention scores dominate, and the 70% of GPT-3;
# - the paper's models, per layer and on the busiest GPU.

# %%
from fractions import Fraction

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import demo, memory_model
from ag.memory_model import format_bytes

table, show = ag.tables.table, ag.plot.show  # the helpers every notebook uses

# %% [markdown]
# ## Measured against predicted
#
# `ag.demo.transformer_memory` builds float16 layers of three shapes (s ≫ h, s ≈ h, s ≪ h) and
# measures, with tracemalloc in NumPy's domain, the bytes each forward leaves alive minus its
# output plus its input: `ag.trace.measure_activation_bytes`. The settings: no recomputation,
# selective, full, flash attention, a GQA layer (8 query heads, 2 key/value heads), and stacks
# of 4 layers under NeMo's full-recomputation methods (bytes after the forward, over L).

# %%
rows = demo.transformer_memory()
demo.activation_table(rows)
print(f"\n{sum(r.measured_bytes == r.predicted_bytes for r in rows)} of {len(rows)} rows equal to the byte")

# %%
show(ag.plot.measured_vs_predicted(demo.activation_series(rows),
                                   title="Activations per layer, float16: measured against formula"))

# %% [markdown]
# ## What the bytes are made of
#
# `ag.memory_model.activation_terms` lists the tensors one layer keeps, in forward order. For the
# three measured shapes without recomputation: at s = 512, h = 64 the three attention-score
# tensors (softmax output, its dropout mask, the dropped-out probabilities: 5as²b) are most of
# the layer; at s = 32, h = 256 the 34sbh of inputs, Q, K, V, GeLU and masks are.

# %%
shapes = {f"s={s}, b={b}, h={h}, a={a}": (s, b, h, a) for s, b, h, a in demo.TRANSFORMER_SHAPES}
terms = {label: memory_model.activation_terms(*shape) for label, shape in shapes.items()}
for label, shape in shapes.items():
    terms[label + "\nselective"] = memory_model.activation_terms(*shape, recompute="selective")
show(ag.plot.activation_breakdown(terms, title="What one float16 layer keeps for backward"))

# %% [markdown]
# The same breakdown for one GPT-3 layer (a = 96, s = 2048, h = 12288, b = 1) under each row of
# the paper's Table 2 with t = 8: tensor parallelism divides everything but the 10sbh of layer
# norms, linear inputs and dropout masks; sequence parallelism divides those too; selective
# recomputation removes the scores; full recomputation keeps the input alone.

# %%
gpt3 = dict(s=2048, b=1, h=12288, a=96)
table_2 = {name: memory_model.activation_terms(**gpt3, **{"t": 8, **options})
           for name, options in memory_model.TABLE_2.items()}
show(ag.plot.activation_breakdown({name.replace(" + ", "\n+ "): parts for name, parts in table_2.items()},
                                  title="One GPT-3 layer on one GPU (t = 8 where parallel)"))
table(("Table 2 row", "bytes per layer", "in sbh"),
      [(name, format_bytes(sum(parts.values())), f"{Fraction(sum(parts.values()), 2048 * 12288)}")
       for name, parts in table_2.items()])

# %% [markdown]
# ## When the scores dominate, and GPT-3's 70%
#
# The scores' share of a layer is (5as/h) / (34 + 5as/h): it passes one half at s = 34h/(5a),
# 6.8 times the head dimension, 870 tokens for GPT-3's h/a = 128. That share is exactly what
# selective recomputation removes (`ag.memory_model.selective_savings`).

# %%
lengths = [2 ** k for k in range(7, 16)]
shares = [memory_model.selective_savings(s, 96, 12288) for s in lengths]
fig, ax = plt.subplots(figsize=(6.5, 4))
ax.plot(lengths, [100 * x for x in shares], marker="o")
ax.axvline(34 * 12288 / (5 * 96), color="grey", linestyle=":", linewidth=0.8, label="s = 34h/(5a)")
ax.annotate(f"GPT-3, s = 2048: {memory_model.selective_savings(2048, 96, 12288):.1%}",
            (2048, 100 * memory_model.selective_savings(2048, 96, 12288)), textcoords="offset points",
            xytext=(8, -14))
ax.set_xscale("log", base=2)
ax.set_xlabel("sequence length s")
ax.set_ylabel("scores' share of the layer (%)")
ax.set_title("GPT-3's layer (a = 96, h = 12288): the scores' share")
ax.legend()
fig.tight_layout()
show(fig)
print(f"GPT-3: selective recomputation saves {memory_model.selective_savings(2048, 96, 12288):.1%} of the "
      f"activation memory; the paper prices it at "
      f"{memory_model.selective_flops_overhead(2048, 12288, 96, 51200):.1%} more FLOPs (Appendix A)")

# %% [markdown]
# ## The paper's models
#
# `ag.memory_model.paper_table()` evaluates the formulas at the 22B, 175B, 530B and 1T models of
# the paper's Table 3 (s = 2048, t = 8): one layer on one GPU, the same as a percentage of tensor
# parallelism alone (the paper's Figure 7), and times the layers' worth of activations the first
# pipeline stage holds (L with 1F1B, more with interleaving), the activation bars of Figure 1.

# %%
models = memory_model.paper_table()
names = [r.model.name for r in models]
settings = list(models[0].per_layer)
table(["per layer, one GPU"] + names, [[c] + [format_bytes(r.per_layer[c]) for r in models] for c in settings])
print()
table(["% of tensor parallel"] + names, [[c] + [f"{r.percent_of_baseline[c]:.1f}" for r in models] for c in settings])
print()
table(["first pipeline stage"] + names,
      [["layers in flight"] + [r.layers_in_flight for r in models]]
      + [[c] + [format_bytes(r.first_stage[c]) for r in models] for c in settings])

# %% [markdown]
# Sequence parallelism with selective recomputation leaves 16–20% of what tensor parallelism
# alone keeps (the paper's "5×"), at a fraction of full recomputation's extra compute.
#
# ## NeMo's stack options, the peak during backward
#
# After the forward, a stack under full recomputation keeps ⌈L/n⌉ inputs (uniform) or n inputs
# and L − n whole layers (block), as the table above measured. During backward a replayed chunk
# holds its layers' activations again; `ag.memory_model.activation_bytes` gives the peak, here in
# units of one whole layer F for the 4-layer stack of the table.

# %%
s, b, h, a = demo.TRANSFORMER_SHAPES[0]
F = memory_model.activation_bytes_per_layer(s, b, h, a)
peaks = []
for granularity, method, n in [(None, "uniform", 1), ("selective", "uniform", 1), ("full", "uniform", 1),
                               ("full", "uniform", 2), ("full", "uniform", 4), ("full", "block", 1),
                               ("full", "block", 2), ("full", "block", 4)]:
    peak = memory_model.activation_bytes(4, s, b, h, a, granularity=granularity, method=method,
                                         num_layers_checkpointed=n)
    full = granularity == "full"
    peaks.append((granularity or "none", method if full else "", n if full else "", f"{peak:,}", f"{peak / F:.3f}"))
table(("granularity", "method", "num_layers", "peak B", "peak / F"), peaks)
