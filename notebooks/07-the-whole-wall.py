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
# # 7. The whole wall: parameters, gradients, optimizer state and activations
#
# The live companion to `lectures/07-the-whole-wall.md`. We trace a whole training step (forward,
# backward, optimizer step) and file every byte under a slice of the pie, count the bytes per
# parameter with and without mixed precision, measure the wall of a GPT-like model beside its
# formulas, and train two models on real data. Every number is measured with tracemalloc.

# %%
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np

import ag
import ag.plot
import ag.tables
from ag import amp, demo, train, wall

MB = ag.trace.MB
table, show = ag.tables.table, ag.plot.show

# %% [markdown]
# ## The pie of one training step
#
# Model and optimizer are made inside the timeline, so tracemalloc sees every byte they hold.

# %%
rng = np.random.default_rng(0)
x = ag.Tensor(rng.standard_normal((256, 64)).astype(np.float32))
with ag.trace.tracing() as timeline:
    layers = [ag.nn.Linear(64, 256, seed=1, name="fc1"), ag.nn.Linear(256, 10, seed=2, name="fc2")]
    params = [p for layer in layers for p in layer.parameters()]
    opt = ag.optim.Adam(params)
    loss = ag.mean(ag.relu(layers[1](ag.relu(layers[0](x)))))
    loss.backward()
    opt.step()
    opt.zero_grad()
psi = sum(p.size for p in params)
last_step = [s for s in timeline if s.op == "Adam"][-1]
table(("category", "bytes", "bytes / parameter"),
      [(c, f"{n:,}", f"{n / psi:.2f}") for c, n in last_step.categories.items() if n])
show(ag.plot.memory_stack({"one Adam step": timeline}))

# %% [markdown]
# ## Bytes per parameter: 4 + 4 + 8, and 2 + 2 + 12
#
# Mixed precision keeps a float32 master copy of every weight: the 16 bytes stay 16.

# %%
tiny = wall.WallConfig(num_layers=1, hidden=32, heads=2, seq=32, batch=2, vocab=16)
psi = wall.parameter_count(tiny)
rows = []
for config in (tiny, replace(tiny, dtype="float16")):
    measured, _ = wall.measure(config)
    rows.append((config.dtype, *(f"{measured[s] / psi:g}" for s in ("parameters", "gradients", "optimizer state")),
                 f"{measured['activations']:,}"))
table(("compute", "parameters B/Ψ", "gradients B/Ψ", "optimizer state B/Ψ", "activations B"), rows)

# %% [markdown]
# ## Why master weights: updates that float16 rounds away
#
# Near 1.0, float16 values are 2⁻¹⁰ ≈ 0.001 apart: a step of 1e-4 is lost, a hundred times over.

# %%
alone = np.ones(1, np.float16)
w = ag.Tensor(np.ones(1, np.float16), requires_grad=True)
mixed = amp.MixedPrecision([w], ag.optim.SGD, lr=1e-4)
for _ in range(100):
    alone -= np.float16(1e-4)
    w.grad = np.ones(1, np.float16)
    mixed.step()
print(f"float16 alone: {float(alone[0]):.4f}   with a float32 master: {float(w.value[0]):.4f}")

# %% [markdown]
# ## Dynamic loss scaling: skip, halve, grow
#
# float16 overflows past 65504, so a scale of 2¹⁶ makes the first scaled loss inf: that step is
# skipped and the scale halved, as torch's GradScaler does.

# %%
p = ag.Tensor(np.full(4, 0.5, np.float16), requires_grad=True)
opt16 = amp.MixedPrecision([p], ag.optim.Adam, lr=0.01)
scaler = amp.LossScaler(growth_interval=3)
for step in range(6):
    scaler.scale(ag.sum(p * p)).backward()
    stepped = scaler.step(opt16)
    scaler.update()
    opt16.zero_grad()
    print(f"step {step}: {'stepped' if stepped else 'skipped'}, scale now {scaler.scale_value:g}")

# %% [markdown]
# ## The wall of a GPT-like model, measured beside its formulas

# %%
bars = demo.wall_demo(None, sizes=((1, 32, 2), (2, 32, 2)), batches=(1, 4), seq=32)
show(ag.plot.memory_wall([(bar.short_label, bar.measured, bar.predicted) for bar in bars]))

# %% [markdown]
# ## Trained on real data: the digits

# %%
x_train, y_train, x_test, y_test = train.load_digits_split()
mlp = train.DigitsMLP()
mlp_opt = ag.optim.Adam(list(mlp.parameters()), lr=1e-2)
digit_losses = train.fit(train.digits_loss_at(mlp, x_train, y_train), mlp_opt, range(300), desc="digits")
print(f"test accuracy: {train.accuracy(mlp, x_test, y_test):.1%}")

# %% [markdown]
# ## A character-level transformer on the Zen of Python

# %%
tokens, alphabet = train.encode(train.zen_text())
model = train.CharTransformer(len(alphabet), context=16, hidden=32, heads=2, num_layers=2)
text_opt = ag.optim.Adam(list(model.parameters()), lr=1e-2)
text_losses = train.fit(train.text_loss_at(model, tokens, batch=8), text_opt, range(80), desc="zen")
show(ag.plot.loss_curves({"digits MLP": digit_losses[:80], "character-level transformer": text_losses}))

# %% [markdown]
# ## ZeRO, pipelines and offloading
#
# These run over MPI ranks or on disk: sections 7.6 to 7.8 of the note measure them, with
# `mpiexec -n 4 python -m ag.parallel.zero` (each rank's bytes against ZeRO's formulas),
# `mpiexec -n 4 python -m ag.parallel.pipeline` (GPipe and 1F1B, activations per stage and the
# bubble) and `ag.offload` (checkpoints written to disk and read back early on a thread).
