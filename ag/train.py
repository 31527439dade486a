"""Training on real data: two models, the loop, a progress bar, and checkpoints that resume exactly.

- ``DigitsMLP`` on scikit-learn's bundled 8×8 digits (``load_digits``, offline; the ``data`` extra);
- ``CharTransformer``, a character-level GPT built from ``ag.nn``'s layers with flash attention, on
  the Zen of Python (public domain, shipped with Python itself as the ``this`` module).

One step is the lecture's four lines::

    loss = cross_entropy(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()

Batch t is drawn from a generator seeded with (seed, t), so a run resumed at step k draws the
batches the whole run would have: training 2k steps equals k, save, load, k more, bit for bit.
"""
from __future__ import annotations

import contextlib
import io
import sys
from typing import Callable, Sequence

import numpy as np

from . import nn, ops, optim
from .modes import no_grad
from .tensor import Tensor


def cross_entropy(logits: Tensor, targets: np.ndarray) -> Tensor:
    """L = −(1/n) Σ_i log softmax(z_i)[y_i] over the rows of ``logits`` (n, classes)."""
    if logits.ndim != 2 or np.shape(targets) != logits.shape[:1]:
        raise ValueError(f"cross_entropy: expected logits (n, classes) and n integer targets, got logits "
                         f"{logits.shape} and targets {np.shape(targets)}")
    picked = ops.getitem(ops.log_softmax(logits, axis=-1), (np.arange(logits.shape[0]), targets))
    return -ops.mean(picked)


def batch_indices(step: int, n: int, batch: int, seed: int) -> np.ndarray:
    """The ``batch`` example indices of step ``step``: the same for a run and its resumption."""
    return np.random.default_rng((seed, step)).integers(0, n, batch)


# ---- digits ----

def load_digits_split(test_fraction: float = 0.25, seed: int = 0) -> tuple[np.ndarray, ...]:
    """scikit-learn's 1797 digits, pixels scaled to [0, 1] in float32: (x_train, y_train, x_test, y_test)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise ImportError("ag.train.load_digits_split needs scikit-learn: pip install 'ag[data]'") from None
    digits = load_digits()
    order = np.random.default_rng(seed).permutation(len(digits.target))
    x, y = (digits.data[order] / 16).astype(np.float32), digits.target[order]
    n_test = int(len(y) * test_fraction)
    return x[n_test:], y[n_test:], x[:n_test], y[:n_test]


class DigitsMLP(nn.Module):
    """64 pixels → ``hidden`` → ReLU → 10 logits."""

    def __init__(self, hidden: int = 128, *, seed: int = 0, dtype=np.float32) -> None:
        self.fc1 = nn.Linear(64, hidden, seed=(seed, 1), dtype=dtype, name="fc1")
        self.fc2 = nn.Linear(hidden, 10, seed=(seed, 2), dtype=dtype, name="fc2")
        self.fc1.weight.value *= 10  # N(0, 0.2²): the 0.02 of Megatron's deep stacks trains a shallow net slowly

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc2(ops.relu(self.fc1(x)))


def accuracy(model: Callable[[Tensor], Tensor], x: np.ndarray, y: np.ndarray) -> float:
    """The share of ``x`` whose largest logit is its label."""
    with no_grad():
        logits = model(Tensor(x)).value
    return float(np.mean(np.argmax(logits, axis=1) == y))


# ---- a character-level transformer ----

def zen_text() -> str:
    """The Zen of Python, decoded from the ``this`` module without printing it (857 characters)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return "".join(this.d.get(c, c) for c in this.s)


class CharTransformer(nn.Module):
    """Tokens (b, s) → embeddings + positions → ``num_layers`` TransformerLayers (flash attention,
    causal, no dropout) → LayerNorm → logits (s·b, vocab), rows in Megatron's (s, b) order."""

    def __init__(self, vocab: int, *, context: int = 32, hidden: int = 64, heads: int = 4, num_layers: int = 2,
                 seed: int = 0, dtype=np.float32) -> None:
        rng = np.random.default_rng((seed, 0))
        self.embedding = Tensor((rng.standard_normal((vocab, hidden)) * 0.02).astype(dtype),
                                requires_grad=True, name="embedding")
        self.positions = Tensor((rng.standard_normal((context, hidden)) * 0.02).astype(dtype),
                                requires_grad=True, name="positions")
        self.body = nn.Transformer(num_layers, hidden, heads, attention="flash", dropout=0.0, seed=seed, dtype=dtype)
        self.ln = nn.LayerNorm(hidden, dtype=dtype, name="ln_f")
        self.head = nn.Linear(hidden, vocab, seed=(seed, 1), dtype=dtype, name="head")
        self.context = context

    def __call__(self, tokens: np.ndarray) -> Tensor:
        b, s = tokens.shape
        if s > self.context:
            raise ValueError(f"CharTransformer: a sequence of {s} tokens is longer than the context of {self.context}")
        x = ops.getitem(self.embedding, tokens.T) + ops.reshape(ops.getitem(self.positions, slice(0, s)), (s, 1, -1))
        return self.head(ops.reshape(self.ln(self.body(x)), (s * b, -1)))


def encode(text: str) -> tuple[np.ndarray, str]:
    """The text as token ids, and the alphabet (sorted characters) they index."""
    alphabet = "".join(sorted(set(text)))
    return np.array([alphabet.index(c) for c in text], dtype=np.int64), alphabet


def text_batch(tokens: np.ndarray, step: int, batch: int, context: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``batch`` windows of ``context`` tokens and their next tokens as targets in (s, b) order."""
    starts = batch_indices(step, len(tokens) - context, batch, seed)
    windows = np.stack([tokens[i:i + context + 1] for i in starts])
    return windows[:, :-1], windows[:, 1:].T.reshape(-1)


def digits_loss_at(model: DigitsMLP, x: np.ndarray, y: np.ndarray, batch: int = 64,
                   seed: int = 0) -> Callable[[int], Tensor]:
    """The loss of step t on its batch of digits, as ``fit`` takes it."""
    def loss_at(t: int) -> Tensor:
        i = batch_indices(t, len(y), batch, seed)
        return cross_entropy(model(Tensor(x[i])), y[i])
    return loss_at


def text_loss_at(model: CharTransformer, tokens: np.ndarray, batch: int = 16, seed: int = 0) -> Callable[[int], Tensor]:
    """The loss of step t on its batch of windows of the text, as ``fit`` takes it."""
    def loss_at(t: int) -> Tensor:
        x, y = text_batch(tokens, t, batch, model.context, seed)
        return cross_entropy(model(x), y)
    return loss_at


# ---- the loop ----

def fit(loss_at: Callable[[int], Tensor], optimizer, steps: range, *, progress: bool = True,
        desc: str = "train") -> list[float]:
    """Run ``loss_at(t)``, backward, step and zero_grad for each t in ``steps``; the losses, as floats."""
    losses = []
    bar = Progress(len(steps), desc) if progress and len(steps) else None
    for t in steps:
        loss = loss_at(t)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.value))
        if bar is not None:
            bar.update(losses[-1])
    if bar is not None:
        bar.close()
    return losses


class Progress:
    """A one-line progress bar on stderr: ``train [#####.....] 50/100 loss 0.512``."""

    def __init__(self, total: int, desc: str, width: int = 30, stream=None) -> None:
        if total < 1:
            raise ValueError(f"Progress: total must be at least 1 step, got {total}")
        self.total, self.desc, self.width, self.done = total, desc, width, 0
        self.stream = sys.stderr if stream is None else stream

    def update(self, loss: float) -> None:
        """Count one step; redraw at each whole percent (a hundred lines at most in a log)."""
        self.done += 1
        if 100 * self.done // self.total == 100 * (self.done - 1) // self.total and self.done < self.total:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.desc} [{bar}] {self.done}/{self.total} loss {loss:.3f}")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")


# ---- checkpoints ----

def save_checkpoint(path, params: Sequence[Tensor], optimizer: optim.Optimizer, step: int, scaler=None) -> None:
    """Write the parameters, the optimizer's state dict (``amp.MixedPrecision``'s with its master copies),
    the loss scaler's if given, and the step to one ``np.savez`` file (no pickles)."""
    arrays = {f"model.{i}": p.value for i, p in enumerate(params)}
    arrays |= {f"optimizer.{k}": v for k, v in optim.state_dict_to_arrays(optimizer.state_dict()).items()}
    if scaler is not None:
        arrays |= {f"scaler.{k}": np.asarray(v) for k, v in scaler.state_dict().items()}
    np.savez(path, step=np.asarray(step), **arrays)


def load_checkpoint(path, params: Sequence[Tensor], optimizer: optim.Optimizer, scaler=None) -> int:
    """Copy a ``save_checkpoint`` file into ``params`` (in place), ``optimizer`` and ``scaler`` if given;
    returns its step."""
    with np.load(path, allow_pickle=False) as saved:
        names = [k for k in saved.files if k.startswith("model.")]
        if len(names) != len(params):
            raise ValueError(f"load_checkpoint: {path} holds {len(names)} parameters, the model has {len(params)}")
        for i, p in enumerate(params):
            value = saved[f"model.{i}"]
            if value.shape != p.shape or value.dtype != p.dtype:
                raise ValueError(f"load_checkpoint: {path} holds parameter {i} as {value.shape} {value.dtype}, "
                                 f"expected {p.shape} {p.dtype} like {p.describe()}")
            p.value[...] = value
        state = {k[len("optimizer."):]: saved[k] for k in saved.files if k.startswith("optimizer.")}
        optimizer.load_state_dict(optim.state_dict_from_arrays(state))
        if scaler is not None:
            scaler.load_state_dict({k[len("scaler."):]: saved[k] for k in saved.files if k.startswith("scaler.")})
        return int(saved["step"])
