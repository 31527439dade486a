"""Activation memory of a transformer layer, in exact bytes: Korthikanti et al. 2022.

"Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198)
counts, for one pre-LN transformer layer on an (s, b, h) input with a heads, every
tensor its backward reads. With 16-bit values and 1-byte dropout masks (Section 4.1):

    tensor                                  values     masks   Table 2 with t-way tensor parallelism
    layernorm1.input                        sbh                 replicated (÷t with sequence parallel)
    attention.qkv_input                     sbh                 replicated (÷t with sequence parallel)
    attention.q                             sbh                 ÷t
    attention.k, attention.v                sbh·g/a each        ÷t
    attention.softmax_output                as²b                ÷t
    attention.softmax_dropout_mask                     as²b     ÷t
    attention.softmax_dropout_output        as²b                ÷t
    attention.projection_input              sbh                 ÷t
    attention.dropout_mask                             sbh      replicated (÷t with sequence parallel)
    layernorm2.input                        sbh                 replicated (÷t with sequence parallel)
    mlp.input                               sbh                 replicated (÷t with sequence parallel)
    mlp.gelu_input                          4sbh                ÷t
    mlp.gelu_output                         4sbh                ÷t  (the input of the 4h → h linear)
    mlp.dropout_mask                                   sbh      replicated (÷t with sequence parallel)

g is the number of key/value groups (GQA; g = a is ordinary multi-head attention, g = 1
is MQA). With g = a, 2 bytes a value and 1 byte a mask the sum is

    sbh(34 + 5as/h)                      no parallelism            (Eq. 1)
    sbh(10 + 24/t + 5as/(ht))            tensor parallel           (Eq. 2)
    sbh/t · (34 + 5as/h)                 tensor + sequence         (Eq. 4)
    sbh(10 + 24/t), 34sbh/t              selective recomputation   (Table 2, Eq. 6)
    2sbh                                 full recomputation        (Table 2)

Selective recomputation drops the three as²b tensors (recomputed from Q and K in
backward; FlashAttention never stores them either). Full recomputation keeps only the
layer input, sbh values, divided by t with sequence parallelism (the paper's Table 2
assumes it is not). Like the paper, the layer-norm mean and variance (2sb values) are
left out. Every function is integer arithmetic and refuses a shape that does not divide.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from fractions import Fraction

RECOMPUTE = (None, "selective", "full")  # NeMo's activations_checkpoint_granularity, as ag.nn takes it
METHODS = ("uniform", "block")  # NeMo's activations_checkpoint_method
ATTENTION_SCORES = ("attention.softmax_output", "attention.softmax_dropout_mask",
                    "attention.softmax_dropout_output")


# ---- one layer ----

@dataclass(frozen=True)
class LayerShape:
    """One transformer layer as the formulas see it: its shape (s, b, h, a), its parallelism,
    its recomputation and the bytes of a value and of a mask (the paper's 2 and 1)."""

    s: int
    b: int
    h: int
    a: int
    t: int = 1
    sequence_parallel: bool = False
    recompute: str | None = None
    num_query_groups: int | None = None
    bytes_per_value: int = 2
    bytes_per_mask: int = 1


@dataclass(frozen=True)
class _Shard:
    """What one tensor-parallel rank holds of a layer, the shapes checked.

    ``tokens`` is the sequence length of the regions outside tensor parallelism (the
    layer norms, the inputs of the linear layers, the dropouts after the projections):
    s, or s/t with sequence parallelism.
    """

    s: int
    b: int
    h: int
    head_dim: int
    heads: int
    groups: int
    tokens: int
    mlp_width: int


def _check_positive(op: str, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{op}: {name} must be a positive integer, got {value!r}")


def _check_layer(op: str, layer: LayerShape) -> _Shard:
    s, b, h, a, t = layer.s, layer.b, layer.h, layer.a, layer.t
    for name in ("s", "b", "h", "a", "t", "bytes_per_value", "bytes_per_mask"):
        _check_positive(op, name, getattr(layer, name))
    g = a if layer.num_query_groups is None else layer.num_query_groups
    _check_positive(op, "num_query_groups", g)
    if layer.recompute not in RECOMPUTE:
        raise ValueError(f"{op}: recompute must be None, 'selective' or 'full', got {layer.recompute!r}")
    if not isinstance(layer.sequence_parallel, bool):
        raise ValueError(f"{op}: sequence_parallel must be True or False, got {layer.sequence_parallel!r}")
    if h % a:
        raise ValueError(f"{op}: hidden size h={h} is not divisible by a={a} heads; "
                         f"expected h % a == 0 so that each head gets h/a channels")
    if a % g:
        raise ValueError(f"{op}: a={a} heads are not divisible by num_query_groups={g}; "
                         f"expected a % num_query_groups == 0 (each key/value group serves a/g heads)")
    if a % t:
        raise ValueError(f"{op}: a={a} heads cannot be split over t={t} tensor-parallel ranks; "
                         f"expected a % t == 0")
    if g % t:
        raise ValueError(f"{op}: num_query_groups={g} key/value groups cannot be split over t={t} "
                         f"tensor-parallel ranks; expected num_query_groups % t == 0 "
                         f"(key/value heads replicated across ranks are not modelled)")
    if layer.sequence_parallel and s % t:
        raise ValueError(f"{op}: sequence length s={s} cannot be split over t={t} ranks for sequence "
                         f"parallelism; expected s % t == 0")
    tokens = s // t if layer.sequence_parallel else s
    return _Shard(s, b, h, h // a, a // t, g // t, tokens, 4 * h // t)


def _terms(op: str, layer: LayerShape) -> dict[str, int]:
    x = _check_layer(op, layer)
    bytes_per_value, bytes_per_mask = layer.bytes_per_value, layer.bytes_per_mask
    replicated = x.tokens * x.b * x.h  # a (tokens, b, h) tensor outside the tensor-parallel regions
    if layer.recompute == "full":
        return {"layer.input": replicated * bytes_per_value}
    scores = x.heads * x.s * x.s * x.b  # (a/t, s, s) per sample
    elements = {
        "layernorm1.input": (replicated, bytes_per_value),
        "attention.qkv_input": (replicated, bytes_per_value),
        "attention.q": (x.s * x.b * x.heads * x.head_dim, bytes_per_value),
        "attention.k": (x.s * x.b * x.groups * x.head_dim, bytes_per_value),
        "attention.v": (x.s * x.b * x.groups * x.head_dim, bytes_per_value),
        "attention.softmax_output": (scores, bytes_per_value),
        "attention.softmax_dropout_mask": (scores, bytes_per_mask),
        "attention.softmax_dropout_output": (scores, bytes_per_value),
        "attention.projection_input": (x.s * x.b * x.heads * x.head_dim, bytes_per_value),
        "attention.dropout_mask": (replicated, bytes_per_mask),
        "layernorm2.input": (replicated, bytes_per_value),
        "mlp.input": (replicated, bytes_per_value),
        "mlp.gelu_input": (x.s * x.b * x.mlp_width, bytes_per_value),
        "mlp.gelu_output": (x.s * x.b * x.mlp_width, bytes_per_value),
        "mlp.dropout_mask": (replicated, bytes_per_mask),
    }
    return {name: count * size for name, (count, size) in elements.items()
            if not (layer.recompute == "selective" and name in ATTENTION_SCORES)}


def _layer_bytes(op: str, layer: LayerShape) -> int:
    """Bytes one layer keeps for backward: the sum of its terms."""
    return sum(_terms(op, layer).values())


def activation_terms(s: int, b: int, h: int, a: int, *, t: int = 1, sequence_parallel: bool = False,
                     recompute: str | None = None, num_query_groups: int | None = None,
                     bytes_per_value: int = 2, bytes_per_mask: int = 1) -> dict[str, int]:
    """Bytes of each tensor one layer keeps for backward, on one tensor-parallel rank, in
    forward order (the table in this module's docstring).

    ``recompute="selective"`` leaves out the three attention-score tensors;
    ``recompute="full"`` gives the single entry ``layer.input``.
    """
    layer = LayerShape(s, b, h, a, t, sequence_parallel, recompute, num_query_groups, bytes_per_value, bytes_per_mask)
    return _terms("activation_terms", layer)


def activation_bytes_per_layer(s: int, b: int, h: int, a: int, *, t: int = 1,
                               sequence_parallel: bool = False, recompute: str | None = None,
                               num_query_groups: int | None = None, bytes_per_value: int = 2,
                               bytes_per_mask: int = 1) -> int:
    """sbh(34 + 5as/h) bytes for 2-byte values and 1-byte masks: the sum of ``activation_terms``.

    t-way tensor parallel: sbh(10 + 24/t + 5as/(ht)); with sequence parallelism
    sbh/t · (34 + 5as/h); selective recomputation drops the 5as/h term; full keeps 2sbh.
    Raises ValueError unless h % a, a % g, a % t, g % t (and s % t with sequence
    parallelism) are all 0, g = num_query_groups (None means a).
    """
    layer = LayerShape(s, b, h, a, t, sequence_parallel, recompute, num_query_groups, bytes_per_value, bytes_per_mask)
    return _layer_bytes("activation_bytes_per_layer", layer)


def selective_savings(s: int, a: int, h: int, *, num_query_groups: int | None = None,
                      bytes_per_value: int = 2, bytes_per_mask: int = 1) -> float:
    """Share of a layer's activation bytes that selective recomputation removes:
    (5as/h) / (34 + 5as/h) for 2-byte values and 1-byte masks (Section 5: 70% for GPT-3)."""
    options = dict(num_query_groups=num_query_groups, bytes_per_value=bytes_per_value,
                   bytes_per_mask=bytes_per_mask)
    kept = activation_bytes_per_layer(s, 1, h, a, recompute="selective", **options)
    return 1 - kept / activation_bytes_per_layer(s, 1, h, a, **options)


def selective_flops_overhead(s: int, h: int, num_layers: int, v: int) -> float:
    """Extra FLOPs of selective recomputation as the paper counts them: hardware/model FLOPs − 1
    (Appendix A, Eq. 8 / Eq. 7) = (s/6h) / (1 + s/6h + v/(12hL)), 2.7% for GPT-3.

    The paper's extra term s/6h is the attention core's forward *and* backward. Rerunning only
    its forward (QKᵀ and attention-over-V, which is what ``ag.count_ops`` counts on an
    ``ag.nn`` layer) costs (s/18h) / (1 + s/6h + v/(12hL)): 0.9% for GPT-3. Lecture 5 shows both.
    """
    for name, value in (("s", s), ("h", h), ("num_layers", num_layers), ("v", v)):
        _check_positive("selective_flops_overhead", name, value)
    extra = Fraction(s, 6 * h)
    return float(extra / (1 + extra + Fraction(v, 12 * h * num_layers)))


# ---- a stack of layers: NeMo's recomputation options ----

def activation_bytes(num_layers: int, s: int, b: int, h: int, a: int, *, t: int = 1,
                     sequence_parallel: bool = False, granularity: str | None = None,
                     method: str = "uniform", num_layers_checkpointed: int = 1,
                     num_query_groups: int | None = None, bytes_per_value: int = 2,
                     bytes_per_mask: int = 1) -> int:
    """Peak activation bytes of a stack of L layers over one forward and backward, as NeMo's
    ``activations_checkpoint_granularity``, ``_method`` and ``_num_layers`` configure it.

    With F = one layer's bytes without recomputation, S = with selective, X = the layer
    input (``recompute="full"``) and n = ``num_layers_checkpointed``:

    - granularity None: L·F, all kept at the end of the forward (Eq. 5 with p = 1).
    - ``"selective"``: L·S (Eq. 6); the scores one layer recomputes inside its backward are
      transient and, as in the paper, not counted.
    - ``"full"``, ``"uniform"``: the stack is cut into chunks of n layers (the last may be
      shorter) and only each chunk's input is kept. Backward replays one chunk at a time,
      holding all its layers' activations at once. While chunk c (0-based) is replayed, the
      inputs of chunks 0..c and chunk c's n_c layers are alive; chunk c's input is its first
      layer's ``layernorm1.input``, counted once, so the peak is max over c of c·X + n_c·F,
      = (⌈L/n⌉ − 1)·X + n·F when n divides L. n = L gives L·F, as without recomputation.
    - ``"full"``, ``"block"``: each of the first n layers keeps only its input and replays
      alone; the other L − n keep everything: max(n·X + (L − n)·F, (n − 1)·X + F), the first
      at the end of the forward, the second while layer n−1 is replayed (n = L: as
      ``"uniform"`` with n = 1).

    ``method`` and ``num_layers_checkpointed`` matter only for ``"full"``. The output of the
    last layer is not counted (it belongs to whatever reads it), nor are gradients,
    parameters or the layer-norm statistics.
    """
    op = "activation_bytes"
    _check_positive(op, "num_layers", num_layers)
    if granularity not in RECOMPUTE:
        raise ValueError(f"{op}: granularity must be None, 'selective' or 'full', got {granularity!r}")
    if method not in METHODS:
        raise ValueError(f"{op}: method must be 'uniform' or 'block', got {method!r}")
    _check_positive(op, "num_layers_checkpointed", num_layers_checkpointed)
    if num_layers_checkpointed > num_layers:
        raise ValueError(f"{op}: num_layers_checkpointed={num_layers_checkpointed} is more than the "
                         f"num_layers={num_layers} in the stack; expected 1 <= n <= num_layers")

    layer = LayerShape(s, b, h, a, t, sequence_parallel, None, num_query_groups, bytes_per_value, bytes_per_mask)
    if granularity != "full":
        return num_layers * _layer_bytes(op, replace(layer, recompute=granularity))
    full = _layer_bytes(op, layer)
    kept_input = _layer_bytes(op, replace(layer, recompute="full"))
    if method == "uniform":
        return _uniform_peak(num_layers, num_layers_checkpointed, full, kept_input)
    return _block_peak(num_layers, num_layers_checkpointed, full, kept_input)


def _uniform_peak(num_layers: int, n: int, full: int, kept_input: int) -> int:
    """max over chunks c of c·X + n_c·F: the inputs below chunk c and chunk c replayed whole."""
    chunks = math.ceil(num_layers / n)
    return max(c * kept_input + min(n, num_layers - c * n) * full for c in range(chunks))


def _block_peak(num_layers: int, n: int, full: int, kept_input: int) -> int:
    """max(n·X + (L − n)·F, (n − 1)·X + F): end of the forward, or layer n−1 replayed."""
    return max(n * kept_input + (num_layers - n) * full, (n - 1) * kept_input + full)


# ---- the paper's models ----

@dataclass(frozen=True)
class PaperModel:
    """One row of the paper's Table 3 (s = 2048 and v = 51200 for all, Section 6)."""

    name: str
    a: int
    h: int
    num_layers: int
    t: int
    p: int
    gpus: int
    global_batch: int
    b: int
    s: int = 2048
    v: int = 51200
    interleaving_stages: int | None = None  # m = 3 for 175B and 530B (Section 6)


PAPER_MODELS = (
    PaperModel("22B", a=64, h=6144, num_layers=48, t=8, p=1, gpus=8, global_batch=4, b=4),
    PaperModel("175B (GPT-3)", a=96, h=12288, num_layers=96, t=8, p=8, gpus=64, global_batch=64, b=1,
               interleaving_stages=3),
    PaperModel("530B (MT-NLG)", a=128, h=20480, num_layers=105, t=8, p=35, gpus=280, global_batch=280,
               b=1, interleaving_stages=3),
    PaperModel("1T", a=160, h=25600, num_layers=128, t=8, p=64, gpus=512, global_batch=512, b=1),
)

TABLE_2 = {  # the paper's Table 2, as options of activation_bytes_per_layer
    "no parallelism": {"t": 1},
    "tensor parallel": {},
    "tensor + sequence parallel": {"sequence_parallel": True},
    "tensor parallel + selective": {"recompute": "selective"},
    "tensor + sequence parallel + selective": {"sequence_parallel": True, "recompute": "selective"},
    "full recomputation": {"recompute": "full"},
}
BASELINE = "tensor parallel"  # Figure 7's 100%


def layers_in_flight(num_layers: int, p: int, *, interleaving_stages: int | None = None) -> int:
    """Layers' worth of activations the first pipeline stage holds (Section 4.2.3):
    p microbatches × L/p layers = L with 1F1B; L(1 + (p−1)/(pm)) with m interleaving stages."""
    op = "layers_in_flight"
    _check_positive(op, "num_layers", num_layers)
    _check_positive(op, "p", p)
    if num_layers % p:
        raise ValueError(f"{op}: num_layers={num_layers} cannot be split over p={p} pipeline stages; "
                         f"expected num_layers % p == 0")
    if interleaving_stages is None:
        return num_layers
    _check_positive(op, "interleaving_stages", interleaving_stages)
    if (num_layers // p) % interleaving_stages:
        raise ValueError(f"{op}: the {num_layers // p} layers of a stage cannot be cut into "
                         f"interleaving_stages={interleaving_stages} chunks; expected "
                         f"(num_layers / p) % interleaving_stages == 0")
    return num_layers + (num_layers // p) * (p - 1) // interleaving_stages


def extra_bytes(s: int, b: int, h: int, t: int, p: int, v: int) -> int:
    """Activations outside the layers on the first stage (Section 4.3): embedding dropout
    sbhp/t, plus, only when p = 1, the last layer norm and output layer 4sbh/t and the
    fp32 logits 4sbv/t: sbhL/t · (p/L + δ(p=1)·4/L·(1 + v/h))."""
    op = "extra_bytes"
    for name, value in (("s", s), ("b", b), ("h", h), ("t", t), ("p", p), ("v", v)):
        _check_positive(op, name, value)
    total = s * b * h * p + (4 * s * b * (h + v) if p == 1 else 0)
    if total % t:
        raise ValueError(f"{op}: {total} bytes cannot be split over t={t} ranks; expected h and v "
                         f"to be multiples of t")
    return total // t


@dataclass(frozen=True)
class PaperRow:
    """One model of Table 3 with the paper's activation figures computed from the formulas.

    ``per_layer``: Table 2 evaluated at this model (keys of ``TABLE_2``).
    ``first_stage``: per_layer × ``layers_in_flight``, the activations on the busiest GPU
    (Eq. 5 and 6, with the interleaving factor; the activation bars of Figure 1).
    ``percent_of_baseline``: per_layer as a percentage of tensor parallel (Figure 7).
    ``extra``: Section 4.3's embedding and output-layer activations.
    ``deallocation_savings``: Appendix B's sbhp at 2 bytes, the output tensors the first
    stage frees with the output-tensor-deallocation optimization.
    """

    model: PaperModel
    layers_in_flight: int
    per_layer: dict[str, int]
    first_stage: dict[str, int]
    percent_of_baseline: dict[str, float]
    extra: int
    deallocation_savings: int


def paper_row(model: PaperModel) -> PaperRow:
    """The activation figures of one Table 3 model, from ``activation_bytes_per_layer``."""
    m = model
    per_layer = {name: activation_bytes_per_layer(m.s, m.b, m.h, m.a, **{"t": m.t, **options})
                 for name, options in TABLE_2.items()}
    layers = layers_in_flight(m.num_layers, m.p, interleaving_stages=m.interleaving_stages)
    return PaperRow(
        model=m,
        layers_in_flight=layers,
        per_layer=per_layer,
        first_stage={name: size * layers for name, size in per_layer.items()},
        percent_of_baseline={name: 100 * size / per_layer[BASELINE] for name, size in per_layer.items()},
        extra=extra_bytes(m.s, m.b, m.h, m.t, m.p, m.v),
        deallocation_savings=2 * m.s * m.b * m.h * m.p,
    )


def paper_table() -> list[PaperRow]:
    """The 22B, 175B, 530B and 1T models of Table 3 with their activation memory (see PaperRow)."""
    return [paper_row(model) for model in PAPER_MODELS]


# ---- model states under ZeRO, and pipelines ----

ZERO_STAGES = (0, 1, 2, 3)  # 0 is plain data parallelism
MIXED_PRECISION_ADAM = (2, 2, 12)  # bytes a parameter: fp16 weight, fp16 grad, K = 12 (fp32 weight, m, v)
FLOAT32_ADAM = (4, 4, 8)  # fp32 weight, fp32 grad, K = 8 (m, v): the weight is its own master copy


def zero_bytes_per_rank(psi: int, n_d: int, stage: int, *, bytes_per_parameter: tuple[int, int, int] =
                        MIXED_PRECISION_ADAM) -> dict[str, int]:
    """One rank's model states with ZeRO (Rajbhandari et al. 2020, Figure 1), Ψ parameters over N_d ranks,
    with (params, grads, K) bytes a parameter, (2, 2, 12) for mixed-precision Adam:

        stage 0   2Ψ + 2Ψ + KΨ           = 16Ψ           plain data parallelism
        stage 1   2Ψ + 2Ψ + KΨ/N_d       = 4Ψ + 12Ψ/N_d  optimizer state partitioned (P_os)
        stage 2   2Ψ + (2 + K)Ψ/N_d      = 2Ψ + 14Ψ/N_d  and gradients (P_os+g)
        stage 3   (2 + 2 + K)Ψ/N_d       = 16Ψ/N_d       and parameters (P_os+g+p)

    Returns {"params", "grads", "optimizer_state"} in bytes."""
    op = "zero_bytes_per_rank"
    _check_positive(op, "psi", psi)
    _check_positive(op, "n_d", n_d)
    if stage not in ZERO_STAGES:
        raise ValueError(f"{op}: stage={stage!r}; expected one of {ZERO_STAGES} (0 is plain data parallelism)")
    if psi % n_d:
        raise ValueError(f"{op}: psi={psi} parameters cannot be split over n_d={n_d} ranks; expected psi % n_d == 0")
    params, grads, k = bytes_per_parameter
    shard = psi // n_d
    return {"params": params * (shard if stage >= 3 else psi),
            "grads": grads * (shard if stage >= 2 else psi),
            "optimizer_state": k * (shard if stage >= 1 else psi)}


def pipeline_bubble(p: int, m: int) -> Fraction:
    """The share of a pipeline's time its stages sit idle, GPipe's and 1F1B's alike:
    (p − 1)/(m + p − 1) for p stages and m micro-batches (Narayanan et al. 2021, Section 2.2)."""
    _check_positive("pipeline_bubble", "p", p)
    _check_positive("pipeline_bubble", "m", m)
    return Fraction(p - 1, m + p - 1)


def micro_batches_in_flight(schedule: str, p: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` (0 first) holds at its peak: GPipe all m;
    1F1B at most p − stage (its warm-up forwards plus one), never more than m."""
    op = "micro_batches_in_flight"
    _check_positive(op, "p", p)
    _check_positive(op, "m", m)
    if not 0 <= stage < p:
        raise ValueError(f"{op}: stage={stage!r}; expected 0 <= stage < p={p}")
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - stage, m)
    raise ValueError(f"{op}: schedule={schedule!r}; expected 'gpipe' or '1f1b'")


def format_bytes(n: int) -> str:
    """``n`` bytes in binary units, 2 decimals: 2936012800 -> '2.73 GiB' (the paper's GB
    are GiB: Appendix B's sbhp for 530B)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"
