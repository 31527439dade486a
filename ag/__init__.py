"""ag: a from-scratch NumPy autograd engine that teaches memory and IO in deep learning.

The module map: each module uses only those listed beside it, and each of those sits above it.
Data flows one way, from ops through the engine to tracing and what draws it. `tests/test_layering.py` checks the
map against the imports, and that no library module imports `demo` or `cli`, uses another
module's private names, or shadows a built-in (`ag.sum`, `ag.max` and `ag.pow` live in `ops` only).

<!-- module map -->
| module | uses | what it holds |
| --- | --- | --- |
| `modes` | — | switches: `no_grad`, `eager_grads`, `watching` (whether anything watches the engine) |
| `arrays` | — | where an array lives (NumPy or CuPy), what a Tensor accepts, `unbroadcast` |
| `errors` | — | `GraphError` and `ShapeError` |
| `device_matmul` | — | the product of CuPy arrays, choosing the order that copies fewest bytes |
| `hooks` | modes | the engine's events (a tensor created, an op run, a grad allocated, a step done, a product counted, a phase entered and left): `publish`, `subscribe`, `subscribed`, `record_tensors` |
| `scopes` | hooks, modes | named blocks published as events: scopes (`scope(name)`: `nn` names its layers and attention core, `remat.capture` records them for NeMo's modes) and phases (`phase(name)`: backward, recompute) |
| `export` | — | Perfetto trace JSON and PyTorch memory-snapshot pickles |
| `tables` | — | printing a table of results |
| `memory_model` | — | the transformer activation formulas, sbh(34 + 5as/h) term by term; ZeRO's model states a rank and a pipeline's bubble |
| `trace` | export, hooks, modes | tracemalloc, the lecture's `start_trace`/`snapshot_trace`, categories, `count_ops` (by the phase the events say), `measure_activation_bytes` |
| `discard` | arrays, errors, modes, scopes | discarding values and bringing them back: `discard_value_if_has_rematerializer`, `rematerialize`, `release_unneeded` |
| `tensor_base` | errors | what a Tensor offers besides the engine: `ndim`, `size`, `nbytes`, printing, `.numpy()`, `.item()` |
| `tensor` | arrays, discard, errors, hooks, modes, scopes, tensor_base | the Tensor, `make_output` and `Saved`, the topological sort, `backward` (which decides when a returned grad becomes `.grad` without a copy), `accumulate_grad` |
| `ops/` | arrays, device_matmul, errors, hooks, modes, tensor | every op, forward then backward, a file for each kind: elementwise, matmul, reductions, unary, fused, shape (and `operands`, the helpers they share; `kernels`, the named seams where the lab plugs in) |
| `attention/` | arrays, hooks, modes, ops, tensor | naive and tiled (FlashAttention-2) attention, a file for each part: the shared checks (`shapes`), Philox `dropout`, FlashAttention's `variants`, `naive`, the online softmax (`online`), the tiles both loops use (`tiles`), the `forward` and `backward` loops, `flash_attention` (`flash`, the seam `flash_passes`), FlashDecoding (`decode`), packed batches (`varlen`), and the CuPy RawKernels (`gpu`, with `kernels/*.cu` beside it, imported lazily) |
| `lab/` | attention, ops | the opt-in lab: a large op's blocks and passes shared among threads, swapped into the ops' and attention's seams (`enable`, `on`, `AG_LAB=1`; `seams`), exp with subnormal results flushed (`subnormals`), `flash_attention`'s fixed shift, exp2 and threads, and `set_workers` |
| `checkpoint` | discard, errors, modes, scopes, tensor | `checkpoint(fn, *inputs)`: keep a block's inputs, rerun it in backward (`torch.utils.checkpoint`) |
| `nn` | attention, checkpoint, discard, memory_model, ops, scopes, tensor | transformer layers with NeMo's recomputation settings (they use `checkpoint`, and name the scopes `remat.nemo` reads) |
| `remat/` | checkpoint, discard, errors, hooks, modes, nn, ops, scopes, tensor, trace | rematerialization: chain planners, capture, schedules, the MILP, revolve, DTR (its `examples` build `nn` layers) |
| `optim` | tensor, trace | SGD with momentum, Adam and AdamW, each step in place: their state (allocated at the first step, named, measured) and state dicts for `np.savez` |
| `amp` | arrays, optim, tensor, trace | mixed precision: float16/bfloat16 compute, float32 master weights (`MixedPrecision`), dynamic loss scaling (`LossScaler`) |
| `train` | modes, nn, ops, optim, tensor | training on real data: digits (`DigitsMLP`), a character-level transformer on the Zen of Python, `cross_entropy`, `fit` with a progress bar, checkpoints that resume exactly |
| `offload` | arrays, discard, remat, tensor, trace | offloading a chain's checkpoints to disk (host memory from CuPy) and reading them back early on a thread, against recomputing and keeping |
| `parallel/` | amp, hooks, memory_model, nn, ops, optim, tables, tensor, trace | parallelism over MPI ranks, a file for each scheme: the communicator (`mpi`), Megatron's tensor and sequence parallelism (`tensor_parallel`), ZeRO's stages 1-3 (`zero`), GPipe and 1F1B (`pipeline`), and the bytes a rank holds (`held`); `mpi.StandIn`, one rank measured alone |
| `wall` | amp, memory_model, nn, offload, ops, optim, parallel, remat, tensor, trace | the whole wall: one training step of a GPT-like model by slice, measured beside its formulas, and the `Lever`s that cut them (ZeRO on a `parallel.mpi.StandIn` rank, offloading) |
| `palette` | trace | one colour-blind-safe colour per memory category |
| `plot/` | palette, trace | slide plots and the interactive HTML timeline |
| `course/` | — | the course kit: assign, intake, install, grade, judge, sandbox, Gradescope (it reads ag's files, not its objects) |
| `demo` | attention, memory_model, modes, nn, ops, optim, plot, remat, tables, tensor, trace, train, wall | the lecture demos |
| `cli` | attention, course, demo, parallel | the `ag` command |
<!-- module map -->
"""
# not wall (`from ag import wall`): each grading worker imports ag at its start and needs none of it
from . import amp, attention, lab, memory_model, nn, optim, remat, trace, train
from .trace import count_ops
from .ops import (ShapeError, add, concat, div, dropout, exp, gelu, getitem, layer_norm, linear, log,
                  log_softmax, logsumexp, matmul, max, mean, mul, neg, pow, relu, reshape,
                  scaled_masked_softmax, sigmoid, softmax, sqrt, sub, sum, tanh, transpose, where)
from .arrays import unbroadcast
from .discard import discard_value_if_has_rematerializer, release_unneeded
from .errors import GraphError
from .modes import config, eager_grads, no_grad
from .lab import set_workers
from .tensor import Saved, Tensor, accumulate_grad, backward, make_output, topological_sort

__version__ = "0.1.0"

__all__ = [
    "Tensor", "GraphError", "ShapeError", "trace", "remat", "attention", "lab", "nn", "optim", "amp", "train", "memory_model", "count_ops", "config", "no_grad", "eager_grads",
    "set_workers",
    "backward", "topological_sort", "accumulate_grad", "unbroadcast", "make_output", "Saved",
    "discard_value_if_has_rematerializer", "release_unneeded",
    "add", "sub", "mul", "div", "neg", "pow", "matmul", "sum", "mean", "max", "exp", "log",
    "sqrt", "relu", "tanh", "sigmoid", "gelu", "linear", "reshape", "transpose", "getitem", "concat",
    "softmax", "log_softmax", "logsumexp", "where", "layer_norm", "dropout", "scaled_masked_softmax",
]
