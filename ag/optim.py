"""Optimizers with torch.optim's names: SGD with momentum, Adam and AdamW, each step in place.

An optimizer holds parameters (leaf Tensors with ``requires_grad=True``) and, from its first
``step()`` on, their state: ``state[p]`` maps a name to an array of ``p``'s shape and dtype,
"momentum_buffer" for SGD, "exp_avg" and "exp_avg_sq" for Adam (m and v), with the count
"step". As in torch nothing is allocated before the first step; then 1 or 2 arrays a parameter.
``named_state()`` lists them for whoever labels memory; ``state_bytes()`` adds up their nbytes.

A step changes ``p.value`` in place (``out=``, ``-=``) and reads ``p.grad`` without changing it.
It runs the rule over each parameter ``BLOCK`` values at a time: the rule is elementwise, so the bits
are the same, and its one temporary, ``scratch``, is one block, not one parameter (torch's fused
kernels hold none). A parameter whose arrays are not laid out alike is stepped whole.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Iterable, Iterator, Mapping

import numpy as np

from . import trace
from .tensor import Tensor

STEPPABLE = (np.dtype(np.float32), np.dtype(np.float64))
BLOCK = 1 << 15  # values updated at a time: a step's temporary is one block (128 kB in float32)


class Optimizer:
    """What SGD, Adam and AdamW share: the parameters in one group (torch's ``param_groups[0]``,
    whose hyper-parameters may be changed between steps), their state, ``zero_grad`` and the state dict."""

    state_names: tuple[str, ...] = ()  # the arrays each stepped parameter holds

    def __init__(self, params: Iterable[Tensor], defaults: dict) -> None:
        self.defaults = dict(defaults)
        self.param_groups = [{"params": checked_params(params, type(self).__name__), **defaults}]
        self.state: dict[Tensor, dict] = {}

    @property
    def params(self) -> list[Tensor]:
        return self.param_groups[0]["params"]

    def step(self) -> None:
        """One update of every parameter that has a grad (one without is left alone, as in torch)."""
        for p in self.params:
            if p.grad is not None:
                self.step_param(p)

    def step_param(self, p: Tensor) -> None:
        """Update one parameter with its grad, allocating its state at its first step."""
        if p.grad.shape != p.shape:
            raise ValueError(f"{type(self).__name__}.step: {p.describe()} has shape {p.shape} and a grad "
                             f"of shape {p.grad.shape}; expected a grad of the parameter's shape")
        state = self.state.get(p)
        if state is None:  # the first step allocates the state, as torch does
            state = self.state[p] = self.new_state(p)
        state["step"] += 1
        for arrays in blocks(p.value, p.grad, *(state[name] for name in self.state_names)):
            self.update(self.param_groups[0], state["step"], *arrays)
        trace.record("optimizer step", type(self).__name__, p.name)

    def new_state(self, p: Tensor) -> dict:
        """Step 0 and a zero array of ``p``'s shape and dtype for each of ``state_names``, each
        labelled for tracing as "optimizer state"."""
        state = {"step": 0}
        for name in self.state_names:
            state[name] = np.zeros_like(p.value)
            trace.watch_state(p, name, state[name])
        return state

    def update(self, group: dict, t: int, theta: np.ndarray, grad: np.ndarray, *state: np.ndarray) -> None:
        """Step ``theta`` in place with ``grad`` and the state arrays (``state_names``) at step ``t``."""
        raise NotImplementedError

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Free every parameter's grad (``set_to_none=True``), or fill it with zeros in place."""
        zero_grads(self.params, set_to_none)

    def named_state(self) -> Iterator[tuple[Tensor, str, np.ndarray]]:
        """(parameter, name, array) for every state array held, e.g. (w, "exp_avg", m)."""
        for p, state in self.state.items():
            for name in self.state_names:
                yield p, name, state[name]

    def state_bytes(self) -> int:
        """The bytes of the state arrays held now (0 before the first step)."""
        return sum(array.nbytes for _, _, array in self.named_state())

    def state_dict(self) -> dict:
        """torch's layout, parameters by their index: {"state": {i: {"step": t, name: array}},
        "param_groups": [{hyper-parameters, "params": [0, 1, ...]}]}. The arrays are the
        optimizer's own, not copies (as in torch): save them before the next step."""
        index = {id(p): i for i, p in enumerate(self.params)}
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        group = {**self.param_groups[0], "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Take the state and hyper-parameters of ``state_dict`` (copied), checked against these parameters."""
        name = type(self).__name__
        group = checked_group(name, state_dict, self.defaults, len(self.params))
        state = {}
        for i, saved in state_dict["state"].items():
            p = self.params[checked_index(name, i, len(self.params))]
            state[p] = checked_state(name, int(i), saved, p, self.state_names)
        self.param_groups[0].update(group)
        self.state = state

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.param_groups[0].items() if k != "params")
        return f"{type(self).__name__}({len(self.params)} parameters, {settings})"


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, as torch writes it (dampening 0, not Nesterov):

        g_t = ∇f(θ_{t-1}) + λ θ_{t-1}          λ = weight_decay
        b_t = μ b_{t-1} + g_t                  μ = momentum; b_0 = 0, so b_1 = g_1
        θ_t = θ_{t-1} − γ b_t                  γ = lr  (γ g_t when μ = 0, and no buffer is kept)
    """

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> None:
        check_at_least("SGD", "lr", lr, 0.0)
        check_at_least("SGD", "momentum", momentum, 0.0)
        check_at_least("SGD", "weight_decay", weight_decay, 0.0)
        self.state_names = ("momentum_buffer",) if momentum else ()
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def update(self, group: dict, t: int, theta: np.ndarray, grad: np.ndarray, b: np.ndarray | None = None) -> None:
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        scratch = np.empty_like(theta)
        g = grad
        if weight_decay:
            g = np.multiply(theta, weight_decay, out=scratch)
            g += grad
        if momentum:
            b *= momentum
            b += g
            g = b
        theta -= np.multiply(g, lr, out=scratch)


class Adam(Optimizer):
    """Adam (Kingma & Ba 2015, Algorithm 1), with torch's L2 weight decay added to the gradient:

        g_t = ∇f(θ_{t-1}) + λ θ_{t-1}          λ = weight_decay
        m_t = β1 m_{t-1} + (1 − β1) g_t        exp_avg, m_0 = 0
        v_t = β2 v_{t-1} + (1 − β2) g_t²       exp_avg_sq, v_0 = 0
        m̂_t = m_t / (1 − β1^t)                 v̂_t = v_t / (1 − β2^t)
        θ_t = θ_{t-1} − α m̂_t / (√v̂_t + ε)     α = lr

    The last three lines computed in the paper's faster order (end of its section 2), which
    is torch's rule exactly when ε̂ = ε √(1 − β2^t):

        α_t = α √(1 − β2^t) / (1 − β1^t)       θ_t = θ_{t-1} − α_t m_t / (√v_t + ε̂)
    """

    state_names = ("exp_avg", "exp_avg_sq")
    decoupled = False  # AdamW decays θ itself instead of adding λθ to the gradient

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        name = type(self).__name__
        check_at_least(name, "lr", lr, 0.0)
        check_betas(name, betas)
        check_at_least(name, "eps", eps, 0.0, strictly=True)
        check_at_least(name, "weight_decay", weight_decay, 0.0)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    def update(self, group: dict, t: int, theta: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray) -> None:
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        scratch = np.empty_like(theta)
        g = grad
        if weight_decay and self.decoupled:
            theta *= 1 - lr * weight_decay
        elif weight_decay:
            g = np.multiply(theta, weight_decay, out=scratch)
            g += grad
        adam_update(theta, g, m, v, t, lr, beta1, beta2, eps, scratch)


def adam_update(theta: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float, beta1: float,
                beta2: float, eps: float, scratch: np.ndarray) -> None:
    """Adam's step t, in place: θ, m and v change in their own buffers, and only ``scratch`` (θ's shape)
    holds a temporary. ``g`` may be ``scratch`` itself (L2 weight decay puts g there): read g before writing scratch.

        m ← β1 m + (1 − β1) g          v ← β2 v + (1 − β2) g²
        θ ← θ − α_t m / (√v + ε̂)       α_t = lr √(1 − β2^t) / (1 − β1^t),  ε̂ = ε √(1 − β2^t)
    """
    ### BEGIN SOLUTION
    m -= g  # m_t as g_t + β1 (m_{t-1} − g_t): the same sum, with no temporary
    m *= beta1
    m += g
    g_squared = np.multiply(g, g, out=scratch)
    g_squared *= 1 - beta2
    v *= beta2
    v += g_squared
    denominator = np.sqrt(v, out=scratch)
    denominator += eps * math.sqrt(1 - beta2 ** t)  # ε̂ = ε √(1 − β2^t)
    update = np.divide(m, denominator, out=scratch)
    update *= lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)  # α_t
    theta -= update
    ### END SOLUTION


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2), as torch scales it by lr:

        θ'_{t-1} = θ_{t-1} (1 − α λ)           λ = weight_decay (torch's default 1e-2)
        then Adam's step from θ'_{t-1} with g_t = ∇f(θ_{t-1}), no λθ in the gradient.
    """

    decoupled = True

    def __init__(self, params: Iterable[Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def blocks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """Arrays of one shape as flat views, ``BLOCK`` values at a time; whole, in one piece, unless all are
    C-contiguous or all F-contiguous (else their flat elements would not line up)."""
    order = "C" if all(a.flags.c_contiguous for a in arrays) else "F" if all(a.flags.f_contiguous for a in arrays) else None
    if order is None or arrays[0].size <= BLOCK:
        yield arrays
        return
    flat = [a.reshape(-1, order=order) for a in arrays]
    for start in range(0, flat[0].size, BLOCK):
        yield tuple(f[start:start + BLOCK] for f in flat)


def zero_grads(params: Iterable[Tensor], set_to_none: bool = True) -> None:
    """``zero_grad`` of any optimizer: free each grad, or fill it with zeros; tracing sees the step."""
    for p in params:
        if set_to_none:
            p.grad = None
        elif p.grad is not None:
            p.grad.fill(0)
    trace.record("optimizer step", "zero_grad", None)


# ---- checking what an optimizer is given ----

def checked_params(params: Iterable[Tensor], optimizer: str) -> list[Tensor]:
    """``params`` as a list: leaf float32/float64 Tensors that require grad, each once, at least one."""
    if isinstance(params, (Tensor, np.ndarray)):
        raise TypeError(f"{optimizer}: params should be an iterable of ag.Tensor parameters, "
                        f"got a single {type(params).__name__}: pass [tensor] or model.parameters()")
    params = list(params)
    if not params:
        raise ValueError(f"{optimizer}: got an empty parameter list; expected at least one Tensor with "
                         "requires_grad=True (does the model have parameters?)")
    seen: dict[int, int] = {}
    for i, p in enumerate(params):
        check_param(optimizer, i, p)
        if id(p) in seen:
            raise ValueError(f"{optimizer}: params[{i}] ({p.describe()}) is params[{seen[id(p)]}] again; "
                             "expected each parameter once, or it would be stepped twice a step")
        seen[id(p)] = i
    return params


def check_param(optimizer: str, i: int, p) -> None:
    """A parameter is an ag.Tensor leaf of float32 or float64 that requires grad."""
    if not isinstance(p, Tensor):
        raise TypeError(f"{optimizer}: params[{i}] is a {type(p).__name__}, expected an ag.Tensor "
                        "with requires_grad=True")
    if p.dtype not in STEPPABLE:
        hint = ("; mixed precision keeps float32 master weights, steps those and casts them to "
                f"{p.dtype} for compute" if p.dtype.kind == "f" else "")
        raise TypeError(f"{optimizer}: params[{i}] ({p.describe()}) has dtype {p.dtype}; expected "
                        f"float32 or float64, which the optimizer's state can hold{hint}")
    if not p.is_leaf:
        raise ValueError(f"{optimizer}: params[{i}] ({p.describe()}) is not a leaf: the op {p.op} "
                         "computes it again on every forward, so a step would be lost; expected a leaf "
                         "Tensor with requires_grad=True")
    if not p.requires_grad:
        raise ValueError(f"{optimizer}: params[{i}] ({p.describe()}) does not require grad, so it never "
                         "has one to step with; expected Tensor(..., requires_grad=True)")


def check_at_least(optimizer: str, name: str, value, low: float, strictly: bool = False) -> None:
    """``value`` is a real number >= ``low`` (> ``low`` if ``strictly``), which NaN is not."""
    is_number = isinstance(value, Real) and not isinstance(value, bool)
    if not is_number or not (value > low or (value == low and not strictly)):
        raise ValueError(f"{optimizer}: {name} must be a number {'>' if strictly else '>='} {low:g}, got {value!r}")


def check_betas(optimizer: str, betas) -> None:
    """betas is a pair (β1, β2), each in [0, 1)."""
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{optimizer}: betas must be a pair (beta1, beta2), each in [0, 1), got {betas!r}")
    for i, beta in enumerate(betas):
        if not (isinstance(beta, Real) and not isinstance(beta, bool) and 0.0 <= beta < 1.0):
            raise ValueError(f"{optimizer}: betas[{i}] must be in [0, 1), got {beta!r}")


def checked_group(optimizer: str, state_dict: Mapping, defaults: dict, count: int) -> dict:
    """The hyper-parameters of ``state_dict``'s one group, which must name ``count`` parameters."""
    if not isinstance(state_dict, Mapping) or set(state_dict) != {"state", "param_groups"}:
        raise ValueError(f"{optimizer}.load_state_dict: expected a dict with keys 'state' and 'param_groups' "
                         f"(from state_dict()), got {type(state_dict).__name__}"
                         f"{' with keys ' + str(sorted(state_dict)) if isinstance(state_dict, Mapping) else ''}")
    groups = state_dict["param_groups"]
    if len(groups) != 1 or set(groups[0]) != {"params", *defaults}:
        raise ValueError(f"{optimizer}.load_state_dict: expected one param group with keys "
                         f"{sorted(['params', *defaults])}, got {[sorted(g) for g in groups]}")
    if len(groups[0]["params"]) != count:
        raise ValueError(f"{optimizer}.load_state_dict: the saved group has {len(groups[0]['params'])} "
                         f"parameters, this optimizer {count}")
    return {key: tuple(float(b) for b in value) if key == "betas" else float(value)
            for key, value in groups[0].items() if key != "params"}


def checked_index(optimizer: str, index, count: int) -> int:
    if not isinstance(index, (int, np.integer)) or not 0 <= index < count:
        raise ValueError(f"{optimizer}.load_state_dict: state for parameter {index!r}, expected an index "
                         f"in 0..{count - 1}")
    return int(index)


def checked_state(optimizer: str, i: int, saved: Mapping, p: Tensor, names: tuple[str, ...]) -> dict:
    """A copy of one parameter's saved state: its step count and arrays of ``p``'s shape and dtype."""
    if set(saved) != {"step", *names}:
        raise ValueError(f"{optimizer}.load_state_dict: state {i} has {sorted(saved)}, expected "
                         f"{sorted(['step', *names])}")
    state = {"step": int(saved["step"])}
    for name in names:
        array = saved[name]
        if getattr(array, "shape", None) != p.shape or getattr(array, "dtype", None) != p.dtype:
            raise ValueError(f"{optimizer}.load_state_dict: state {i} {name} is "
                             f"{getattr(array, 'shape', '?')} {getattr(array, 'dtype', type(array).__name__)}, "
                             f"expected {p.shape} {p.dtype} like params[{i}] ({p.describe()})")
        state[name] = np.array(array, copy=True)
    return state


# ---- a state dict as the flat named arrays np.savez writes ----

def state_dict_to_arrays(state_dict: Mapping) -> dict[str, np.ndarray]:
    """``state_dict`` as flat named arrays: "state.0.exp_avg", "state.0.step", "param_groups.0.lr"...
    ``np.savez(file, **state_dict_to_arrays(opt.state_dict()))`` writes them without pickling."""
    arrays = {}
    for i, state in state_dict["state"].items():
        for key, value in state.items():
            arrays[f"state.{i}.{key}"] = np.asarray(value)
    for j, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            arrays[f"param_groups.{j}.{key}"] = np.asarray(value)
    return arrays


def state_dict_from_arrays(arrays: Mapping[str, np.ndarray]) -> dict:
    """The state dict that ``state_dict_to_arrays`` flattened, from ``np.load(file)`` or any mapping."""
    state: dict[int, dict] = {}
    groups: dict[int, dict] = {}
    for name in arrays:
        parts = name.split(".", 2)
        if len(parts) != 3 or parts[0] not in ("state", "param_groups") or not parts[1].isdigit():
            raise ValueError(f"optimizer state file: array {name!r} is not named "
                             "'state.<index>.<name>' or 'param_groups.<index>.<name>'")
        kind, index, key = parts
        value = arrays[name]
        if kind == "state":
            state.setdefault(int(index), {})[key] = int(value) if key == "step" else value
        else:
            groups.setdefault(int(index), {})[key] = group_value(key, value)
    return {"state": state, "param_groups": [groups[j] for j in sorted(groups)]}


def group_value(key: str, value: np.ndarray):
    """A saved hyper-parameter as the group holds it: "params" a list, "betas" a tuple, others a number."""
    if key == "params":
        return [int(i) for i in value]
    if key == "betas":
        return tuple(float(b) for b in value)
    return value.item()
