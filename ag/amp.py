"""Mixed-precision training (Micikevicius et al. 2018): 16-bit compute, float32 master weights,
and dynamic loss scaling for float16.

The model's parameters, activations and grads are float16 or bfloat16 (from ``ml_dtypes``, the
``amp`` extra, as JAX uses it); ``MixedPrecision`` keeps a float32 master copy of each parameter
and steps that with any ``ag.optim`` optimizer, then rounds it back into the 16-bit weight.
Small updates that 16-bit weights would round away accumulate in the master copy.

Bytes per parameter with Adam, ZeRO's accounting (Rajbhandari et al. 2020, section 3.1), as
``ag.trace`` files them:

    float32 Adam:          4 parameters + 4 gradients + 8 optimizer state (m, v)             = 16
    mixed-precision Adam:  2 parameters + 2 gradients + 12 optimizer state (master, m, v)    = 16

Mixed precision does not cut these 16 bytes; it halves the activations and the bytes each
op moves. float16 tops out at 65504, so its grads overflow unless the loss is scaled down to
fit, and underflow below 6e-8 unless it is scaled up: ``LossScaler`` keeps the scale as large as
it can, as ``torch.amp.GradScaler`` does.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from . import optim, trace
from .arrays import is_bfloat16
from .tensor import Tensor


def compute_dtype(name: str) -> np.dtype:
    """The 16-bit dtype ``name`` names: "float16" (NumPy's) or "bfloat16" (``ml_dtypes``')."""
    if name == "float16":
        return np.dtype(np.float16)
    if name != "bfloat16":
        raise ValueError(f"ag.amp: compute dtype must be 'float16' or 'bfloat16', got {name!r}")
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError("ag.amp: bfloat16 needs ml_dtypes: pip install 'ag[amp]'") from None
    return np.dtype(ml_dtypes.bfloat16)


def is_16_bit(dtype: np.dtype) -> bool:
    return dtype == np.float16 or is_bfloat16(dtype)


class MixedPrecision:
    """An optimizer for 16-bit parameters: float32 master copies, stepped by ``optimizer``.

        g32 = float32(g16) / scale            one parameter at a time: a float32 temporary of one parameter
        master ← optimizer's step with g32    master, and the optimizer's state, float32
        θ16 ← round16(master)                 in place

    ``step(inv_scale)`` is called by ``LossScaler.step``; alone, the loss is not scaled.
    """

    def __init__(self, params: Iterable[Tensor], optimizer: type = optim.Adam, **hyper_parameters) -> None:
        self.params = [check_16_bit(i, p) for i, p in enumerate(params)]
        self.master = [self._master_copy(p) for p in self.params]
        self.optimizer = optimizer(self.master, **hyper_parameters)

    @staticmethod
    def _master_copy(p: Tensor) -> Tensor:
        master = Tensor(p.value.astype(np.float32), requires_grad=True, name=p.name)
        trace.watch_state(p, "master", master.value)  # optimizer state in ZeRO's accounting
        return master

    def step(self, inv_scale: float = 1.0) -> None:
        """Step every master copy whose 16-bit parameter has a grad, and round it back."""
        for p, master in zip(self.params, self.master):
            if p.grad is None:
                continue
            master.grad = p.grad.astype(np.float32)
            if inv_scale != 1.0:
                master.grad *= inv_scale
            self.optimizer.step_param(master)
            master.grad = None
            np.copyto(p.value, master.value, casting="unsafe")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free the 16-bit grads (the master copies hold none between steps)."""
        optim.zero_grads(self.params, set_to_none)

    def state_bytes(self) -> int:
        """The float32 master copies and the optimizer's state: 12 bytes a parameter with Adam."""
        return sum(m.value.nbytes for m in self.master) + self.optimizer.state_bytes()

    def state_dict(self) -> dict:
        """The inner optimizer's state dict, each parameter's entry also holding its float32 master copy
        under "master" (apex's fp32_from_fp16), so ``optim.state_dict_to_arrays`` writes it for ``np.savez``.
        The arrays are the optimizer's own, as in torch: save them before the next step."""
        saved = self.optimizer.state_dict()
        for i, master in enumerate(self.master):
            saved["state"].setdefault(i, {})["master"] = master.value
        return saved

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Take the master copies and the inner optimizer's state from ``state_dict`` (copied), and
        round each master into its 16-bit parameter, so that the two agree as after a step."""
        states = state_dict.get("state") if isinstance(state_dict, Mapping) else None
        if not isinstance(states, Mapping) or sorted(states) != list(range(len(self.params))):
            raise ValueError(f"MixedPrecision.load_state_dict: expected a 'state' entry for each of the "
                             f"{len(self.params)} parameters (from MixedPrecision.state_dict()), got "
                             f"{sorted(states) if isinstance(states, Mapping) else type(state_dict).__name__}")
        masters = [checked_master(i, states[i], m) for i, m in enumerate(self.master)]
        inner = {i: {k: v for k, v in s.items() if k != "master"} for i, s in states.items()}
        self.optimizer.load_state_dict({"state": {i: s for i, s in inner.items() if s},
                                        "param_groups": state_dict.get("param_groups")})
        for p, master, saved in zip(self.params, self.master, masters):
            np.copyto(master.value, saved)
            np.copyto(p.value, master.value, casting="unsafe")


def check_16_bit(i: int, p) -> Tensor:
    """A parameter for mixed precision: a float16 or bfloat16 leaf Tensor that requires grad."""
    if not isinstance(p, Tensor) or not is_16_bit(p.dtype):
        what = f"{p.describe()} of dtype {p.dtype}" if isinstance(p, Tensor) else f"a {type(p).__name__}"
        raise TypeError(f"MixedPrecision: params[{i}] is {what}; expected a float16 or bfloat16 Tensor "
                        "(build the model with dtype=ag.amp.compute_dtype('float16'))")
    if not p.is_leaf or not p.requires_grad:
        raise ValueError(f"MixedPrecision: params[{i}] ({p.describe()}) is not a leaf that requires grad; "
                         "expected the model's parameters")
    return p


def checked_master(i: int, saved: Mapping, master: Tensor) -> np.ndarray:
    """Parameter ``i``'s saved master copy: float32, of its parameter's shape."""
    array = saved.get("master") if isinstance(saved, Mapping) else None
    if getattr(array, "shape", None) != master.shape or getattr(array, "dtype", None) != np.float32:
        what = "none" if array is None else f"{getattr(array, 'shape', '?')} {getattr(array, 'dtype', type(array))}"
        raise ValueError(f"MixedPrecision.load_state_dict: state {i}'s master copy is {what}; expected "
                         f"{master.shape} float32 like params[{i}]'s master")
    return array


class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's rule and defaults:

        backward from scale · loss; grads found inf or NaN → skip the step, scale ← scale · backoff_factor
        growth_interval good steps in a row → scale ← scale · growth_factor

    Use as torch does: ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000) -> None:
        if not (init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1 and growth_interval >= 1):
            raise ValueError("LossScaler: expected init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1 "
                             f"and growth_interval >= 1, got {init_scale}, {growth_factor}, {backoff_factor}, "
                             f"{growth_interval}")
        self.scale_value, self.growth_factor, self.backoff_factor = float(init_scale), growth_factor, backoff_factor
        self.growth_interval, self.good_steps, self.found_inf = growth_interval, 0, False

    def scale(self, loss: Tensor) -> Tensor:
        """scale · loss, in the loss's dtype (float16 overflows to inf past 65504: that step is skipped)."""
        with np.errstate(over="ignore"):
            return loss * Tensor(np.asarray(self.scale_value, loss.dtype))

    def step(self, optimizer: MixedPrecision) -> bool:
        """Step ``optimizer`` with the grads unscaled, unless one is inf or NaN; True if it stepped."""
        self.found_inf = any(not finite(p.grad) for p in optimizer.params if p.grad is not None)
        if not self.found_inf:
            optimizer.step(1.0 / self.scale_value)
        return not self.found_inf

    def state_dict(self) -> dict:
        """The scale, the rule's settings and the good steps counted toward growth (torch's GradScaler keys)."""
        return {"scale": self.scale_value, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "growth_tracker": self.good_steps}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Take a ``state_dict()``'s scale, settings and count of good steps (numbers or 0-d arrays)."""
        keys = set(self.state_dict())
        if not isinstance(state_dict, Mapping) or set(state_dict) != keys:
            got = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict).__name__
            raise ValueError(f"LossScaler.load_state_dict: expected the keys {sorted(keys)}, got {got}")
        number = {k: float(np.asarray(v)) for k, v in state_dict.items()}
        self.__init__(number["scale"], number["growth_factor"], number["backoff_factor"],
                      int(number["growth_interval"]))
        self.good_steps = int(number["growth_tracker"])

    def update(self) -> None:
        """Back off after a skipped step; grow after ``growth_interval`` good steps in a row."""
        if self.found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale_value *= self.growth_factor
            self.good_steps = 0


def finite(array: np.ndarray) -> bool:
    """No inf or NaN in ``array``: max and min carry either, without a temporary of its size."""
    return bool(np.isfinite(array.max()) and np.isfinite(array.min()))
