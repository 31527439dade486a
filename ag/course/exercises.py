"""The exercises: which functions of ag each one cuts out, its statement and its self-check."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent  # ag/
REPO = PACKAGE.parent


@dataclass(frozen=True)
class Exercise:
    """One homework: functions copied out of ag modules, a statement and its sanity checks."""

    number: int
    name: str
    title: str
    statement: str
    functions: tuple[tuple[str, str], ...]  # (module under ag, function name)
    imports: str
    checks: str
    expected: str
    needs: tuple[int, ...] = ()  # exercises whose solved functions the self-check runs on in the release

    @property
    def filename(self) -> str:
        return f"ex{self.number}_{self.name}.py"

    @property
    def module_name(self) -> str:
        return f"ex{self.number}_{self.name}"


# The lab's modules whose loops solve an exercise another way (the fixed-shift forward, the base-2
# backward): a handout or a grading worker that stubs one of those exercises gets them as functions
# that refuse, since a student could call or copy them. The lab is the instructor's, not the handout's.
LAB_SOLUTIONS = {"ag/lab/flash_loops.py": (4, 5)}

EXERCISES = (
    Exercise(
        1, "discard_grad", "Discarding the grad",
        "A grad buffer costs as much as its value. Allocate it lazily, the first time something "
        "flows into it (accumulate_grad, which the engine calls with each grad an op's "
        "_backward(out, saved) returns): take the incoming array itself when it is owned (an array "
        "that nothing else holds, such as a fresh product, may become the grad as it is), else a "
        "copy; once it exists, add into it. Free a non-leaf tensor's grad right after its own "
        "backward step (backward_step, which backward runs for each node in turn).",
        (("tensor", "accumulate_grad"), ("tensor", "backward_step")),
        "import numpy as np\n\nfrom ag import hooks\n"
        "from ag.errors import GraphError\nfrom ag.modes import config\n"
        "from ag.tensor import Tensor, _free_graph, _run_step, _shaped_like, pass_grads",
        "import numpy as np\nimport ag\nfrom ag import course, demo\ncourse.install(__name__)\n"
        "run = demo.matmul_chain(4096, 5, eager=False)\n"
        "print('forward MB:', [s.allocated_mb for s in run.forward])\n"
        "print('backward MB:', [s.allocated_mb for s in run.backward])\n"
        "a = ag.Tensor(np.ones(2), requires_grad=True)\nh, kept = a * 3.0, (a * 2.0).retain_grad()\n"
        "ag.sum(h + h + kept).backward()  # a is used twice, h twice: their grads add up\n"
        "print('a.grad:', a.grad, '| h.grad after its step:', h.grad, '| retained grad:', kept.grad)",
        "forward MB: [32, 65, 98, 131, 163]\nbackward MB: [196, 171, 147, 122, 97, 40]\n"
        "a.grad: [8. 8.] | h.grad after its step: None | retained grad: [1. 1.]",
        needs=()),
    Exercise(
        2, "rematerialize", "Rematerialization in the backward loop",
        "A backward step receives exactly the values its op saved (node._saved, and the node "
        "itself if node._saves_output), as saved[t]. Task 1: before the step, give every one of "
        "them that was discarded its value back, by calling rematerialize. Task 2: a tensor with "
        "a rematerializer is not a checkpoint: write discard_value_if_has_rematerializer, and "
        "call it once no step left reads a value (t._needed_by counts the steps that still do).",
        (("tensor", "_run_step"), ("discard", "discard_value_if_has_rematerializer")),
        "from ag.discard import rematerialize\nfrom ag.tensor import Grads, Tensor, call_backward",
        "import numpy as np\nimport ag\nfrom ag import course, remat\ncourse.install(__name__)\n"
        "rng = np.random.default_rng(0)\nws = [ag.Tensor(rng.standard_normal((8, 8)) / 3, requires_grad=True) "
        "for _ in range(10)]\nlayers = [lambda h, w=w: h @ w for w in ws]\nx = ag.Tensor(rng.standard_normal((4, 8)))\n"
        "with ag.count_ops() as counts:\n    ag.sum(remat.sequential(layers, x, [5], mode='tensor')).backward()\n"
        "print(counts)",
        "matmuls: forward 10, recompute 21, backward 19 (total 50); FLOPs: 25,600",
        needs=(1,)),  # its steps run inside exercise 1's backward
    Exercise(
        3, "online_softmax", "Online softmax: merging two blocks",
        "softmax_block gives one block's softmax(s) @ v with its row max m and normalizer l. Write "
        "merge_softmax_blocks: the softmax over both blocks' columns, from the two results alone "
        "(rescale each normalizer to the new max; weight each output by its share of the total).",
        (("attention.online", "merge_softmax_blocks"),),
        "import numpy as np\n\nfrom ag.attention.online import SoftmaxBlock",
        "import numpy as np\nfrom ag import course\nfrom ag.attention import softmax_block\n"
        "course.install(__name__)\nrng = np.random.default_rng(0)\ns, v = rng.standard_normal((3, 8)), "
        "rng.standard_normal((8, 2))\nmerged = merge_softmax_blocks(softmax_block(s[:, :3], v[:3]), "
        "softmax_block(s[:, 3:], v[3:]))\np = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)\n"
        "print('matches softmax(s) @ v:', np.allclose(merged.o, p @ v, rtol=1e-12, atol=0))  # the grader's tolerance",
        "matches softmax(s) @ v: True"),
    Exercise(
        4, "flash_forward", "Tiled attention forward",
        "Write the inner loop of FlashAttention-2's forward: for one query tile q_i, stream the key/value "
        "tiles, keep the running max m_i, the running sum l_i and the unscaled accumulator acc, divide "
        "once at the end into og (O, heads grouped as q's are in qg), and store the row logsumexp "
        "m_i + log l_i into lse_g, the log taken in lse_g's dtype (np.log(l_i, dtype=lse_g.dtype): float64 "
        "for float32 tiles, as L's rounding would shift every P of its row in backward). qg, kg, vg are "
        "q, k, v viewed by tiles.grouped as (..., h_kv, group, n, d): "
        "the query heads that share a key/value head sit side by side, so a key tile kg[..., cols, :] "
        "broadcasts against all of them (grouped-query attention). q_i comes scaled (scale * Q_i); "
        "tiles.scores(q_i, k_j, q_start, k_start) gives the masked score tile (in one buffer that the "
        "next call overwrites, as on-chip memory on a GPU); tiles.key_tiles(q_start, q_stop) the k_start "
        "of each key tile that rows q_start..q_stop-1 can see (a range in steps of tiles.block_k; causal: "
        "up to the last key they see), its columns cols = slice(k_start, k_start + tiles.block_k); tiles.row_max and tiles.row_sum the lecture's rowmax and rowsum of a tile, as (rows, 1) "
        "columns (np.max and np.sum with keepdims=True). Multiply V by tiles.dropout(p, q_start, k_start), "
        "P with dropout's mask applied (P itself without dropout), and sum the undropped P into l_i. "
        "flash_attention runs your loop.",
        (("attention.forward", "tiled_forward"),),
        "import numpy as np\n\nfrom ag.attention.tiles import Tiles, forward_outputs",
        "import numpy as np\nfrom ag import course\nfrom ag.attention import flash_attention, naive_attention\n"
        "course.install(__name__)\nrng = np.random.default_rng(0)\nq, k, v = (rng.standard_normal((1, 2, 50, 8)) "
        "for _ in range(3))\nout = flash_attention(q, k, v, causal=True, block_q=16, block_k=16)\n"
        "print('equals naive:', np.allclose(out, naive_attention(q, k, v, causal=True), rtol=0, atol=1e-10))  "
        "# the grader's tolerance",
        "equals naive: True",
        needs=()),
    Exercise(
        5, "flash_backward", "Tiled attention backward by recomputation",
        "Write FlashAttention-2's backward: D = rowsum(dO * O) (tiles.row_dot(dog, og)); for each key/value tile and each query "
        "tile that sees it (tiles.query_tiles), recompute P = exp(S - L) from "
        "tiles.scores(tiles.scaled_queries(qg, rows), k_j, q_start, k_start) (the scaled query tile, "
        "scale * Q_i) and the saved logsumexp L (a row that saw nothing has L = -inf: subtract +inf there, "
        "so that its P is 0), then dV += P^T dO, dP = dO V^T (tiles.product(do_i, v_j^T), "
        "which takes a float32 product in float64, as tiles.scores does), dS = P * (dP - D), "
        "dQ += dS K (tiles.product(ds, k_j) again), dK += dS^T Q_i, writing into dqg, dkg and dvg (dq "
        "and dk are multiplied by scale "
        "once after your loop; for GQA, group_sum sums dK and dV over the group axis -3). With dropout, "
        "dV takes tiles.dropout(p, q_start, k_start) for P and dP is tiles.dropout(dO V^T, q_start, k_start) "
        "(each the array itself without dropout); with softcap, tiles.softcap_grad(ds) multiplies dS by "
        "the cap's slope in place before dQ and dK. "
        "flash_attention runs your loop.",
        (("attention.backward", "tiled_backward"),),
        "import numpy as np\n\nfrom ag.attention.tiles import Tiles, group_sum",
        "import numpy as np\nimport ag\nfrom ag import course\n"
        "from ag.attention import flash_attention, naive_attention\ncourse.install(__name__)\n"
        "rng = np.random.default_rng(0)\narrays = [rng.standard_normal((1, 2, 40, 8)) for _ in range(3)]\n"
        "grads = []\nfor attention in (naive_attention, flash_attention):\n"
        "    ts = [ag.Tensor(a, requires_grad=True) for a in arrays]\n"
        "    ag.sum(attention(*ts, causal=True)).backward()\n    grads.append([t.grad for t in ts])\n"
        "print('gradients equal naive:', all(np.allclose(a, b, rtol=0, atol=1e-10) for a, b in zip(*grads)))  "
        "# the grader's tolerance",
        "gradients equal naive: True",
        needs=(1, 4)),  # the engine's backward (1) through flash_attention's forward (4)
    Exercise(
        6, "checkpoint_plan", "Choosing checkpoints",
        "Write the sqrt strategy of plan (keep every floor(sqrt(n))-th output, through _every) and the "
        "dynamic program of _optimal: for each last kept output c and each Pareto-optimal (bytes kept, "
        "FLOPs) prefix, try every next kept output j (or none, j = n) whose local peak fits the budget.",
        (("remat.chains.plans", "plan"), ("remat.chains.plans", "_optimal")),
        "import math\n\nimport numpy as np\n\nfrom ag.remat.chains.plans import (RENAMED, STRATEGIES, _every, "
        "_greedy,\n                                   _local_peak, _num_layers, _pareto, as_profile)",
        "from ag import course, remat\ncourse.install(__name__)\nprint('sqrt of 64:', remat.plan(64, 'sqrt'))\n"
        "chain = remat.as_profile([4, 1, 1, 4, 1, 1, 4, 1])\n"
        "print('optimal at 12:', remat.plan(8, 'optimal', chain=chain, budget_bytes=12))",
        "sqrt of 64: [7, 15, 23, 31, 39, 47, 55]\noptimal at 12: [1, 2, 5, 6]"),
    Exercise(
        7, "dtr_eviction", "DTR's eviction rule",
        "Over budget, DTR evicts the resident value t with the smallest h_DTR(t) = cost(t) / (bytes(t) "
        "· staleness(t)) (h_dtr). Its cost also counts e*(t), t's evicted neighbourhood: the evicted "
        "values reachable from t through evicted values alone, along inputs (graph.nodes[k].deps) and "
        "users (graph.users[k]), t excluded; recomputing t needs its evicted inputs, recomputing an "
        "evicted user needs t, and a resident value ends the search (evicted_neighbourhood).",
        (("remat.graphs.dtr", "evicted_neighbourhood"), ("remat.graphs.dtr", "h_dtr")),
        "from ag.remat.graphs.graph import Graph",
        "import numpy as np\nimport ag\nfrom ag import course, remat\ncourse.install(__name__)\n"
        "w = ag.Tensor(np.full((4, 4), 0.1), requires_grad=True)\n"
        "def step(x):  # a chain of six ops, h1 skipping to the add\n    h1 = ag.tanh(x @ w)\n"
        "    return ag.sum(ag.tanh(h1 @ w) + h1)\n"
        "graph = remat.capture(step, ag.Tensor(np.ones((2, 4))))\n"
        "print('nodes:', [node.label for node in graph.nodes])\nevicted = {0, 2, 3}\n"
        "print('e*(1) with 0, 2, 3 evicted:', sorted(evicted_neighbourhood(graph, 1, evicted)))\n"
        "print('e*(4) with 0, 2, 3 evicted:', sorted(evicted_neighbourhood(graph, 4, evicted)))\n"
        "print('h_DTR(96, 256 bytes, staleness 3):', h_dtr(96, 256, 3))",
        "nodes: ['0:matmul', '1:tanh', '2:matmul', '3:tanh', '4:add', '5:sum']\n"
        "e*(1) with 0, 2, 3 evicted: [0, 2, 3]\ne*(4) with 0, 2, 3 evicted: [2, 3]\n"
        "h_DTR(96, 256 bytes, staleness 3): 0.125",
        needs=(1,)),  # capture's measuring run steps through exercise 1's backward_step
    Exercise(
        8, "adam_step", "Adam's step in place",
        "Adam keeps two arrays a parameter, m and v: with the parameter and its grad, 16 bytes a float32 "
        "parameter before any activation. A step must not add more than one parameter's worth on top: write "
        "adam_update, which changes theta, m and v in their own buffers (in-place operators, out=) and puts "
        "every temporary into scratch, an array of theta's shape: m = beta1 m + (1 - beta1) g, "
        "v = beta2 v + (1 - beta2) g^2, theta -= alpha_t m / (sqrt(v) + eps_hat) with "
        "alpha_t = lr sqrt(1 - beta2^t) / (1 - beta1^t) and eps_hat = eps sqrt(1 - beta2^t) (the paper's faster "
        "order, torch's rule). g may be scratch itself (Adam's L2 weight decay computes g there): read g for "
        "the last time before you first write into scratch. ag.optim.Adam and AdamW step with your function.",
        (("optim", "adam_update"),),
        "import math\n\nimport numpy as np",
        "import tracemalloc\n"
        "import numpy as np\n"
        "import ag\n"
        "from ag import course, optim\n"
        "course.install(__name__)\n"
        "w = ag.Tensor(np.array([1.0, -2.0, 3.0]), requires_grad=True)\n"
        "opt = optim.Adam([w], lr=0.1)\n"
        "for _ in range(3):\n"
        "    w.grad = 2 * w.value  # the gradient of Σ w²\n"
        "    opt.step()\n"
        "print('w after 3 steps:', np.round(w.value, 4), '| state bytes:', opt.state_bytes())\n"
        "big = ag.Tensor(np.ones(10**6), requires_grad=True)\n"
        "big.grad = np.ones(10**6)\n"
        "opt = optim.Adam([big])\n"
        "opt.step()  # allocates m and v\n"
        "tracemalloc.start()\n"
        "opt.step()\n"
        "print('temporary MB in a step:', round(tracemalloc.get_traced_memory()[1] / 1e6, 1), '(one parameter: 8.0)')",
        "w after 3 steps: [ 0.7016 -1.7006  2.7004] | state bytes: 48\n"
        "temporary MB in a step: 0.3 (one parameter: 8.0)"),
)


def exercise_of(test_file: Path) -> Exercise:
    """The exercise a graded test file belongs to: the ``exN`` in its name."""
    match = re.search(r"ex(\d+)", test_file.stem)
    number = int(match.group(1)) if match else None
    for exercise in EXERCISES:
        if exercise.number == number:
            return exercise
    raise ValueError(f"graded test file {test_file.name} names no exercise: call it test_exN_... "
                     f"(N one of {', '.join(str(e.number) for e in EXERCISES)})")
