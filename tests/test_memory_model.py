"""ag.memory_model: the activation-memory formulas of Korthikanti et al. 2022, to the byte."""
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ag import memory_model as mm
from ag.memory_model import activation_bytes, activation_bytes_per_layer, activation_terms

GRID = [  # (s, b, h, a, t): s ≫ h, s ≪ h, one head, t = a, the paper's GPT-3 layer
    (4, 1, 8, 2, 1), (4, 2, 8, 2, 2), (64, 3, 16, 4, 4), (512, 2, 32, 4, 2), (8, 2, 256, 8, 8),
    (6, 5, 12, 1, 1), (16, 1, 48, 12, 4), (2048, 1, 12288, 96, 8),
]

exact = settings(max_examples=200, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


@st.composite
def layers(draw):
    """(s, b, h, a, t, g) that divide as the formulas need: a % g, g % t, h % a, s % t."""
    t = draw(st.sampled_from([1, 2, 4, 8]))
    g = t * draw(st.integers(1, 4))
    a = g * draw(st.integers(1, 4))
    h = a * draw(st.integers(1, 16))
    s = t * draw(st.integers(1, 64))
    return s, draw(st.integers(1, 8)), h, a, t, g


def sbh(s, b, h):
    return s * b * h


# ---- one layer: the paper's closed forms are the sum of the itemized list ----

@pytest.mark.parametrize("s, b, h, a, t", GRID)
def test_one_layer_keeps_sbh_34_plus_5as_over_h_bytes(s, b, h, a, t):
    assert activation_bytes_per_layer(s, b, h, a) == sbh(s, b, h) * (34 + Fraction(5 * a * s, h))


@pytest.mark.parametrize("s, b, h, a, t", GRID)
def test_tensor_parallel_keeps_sbh_10_plus_24_over_t_plus_5as_over_ht(s, b, h, a, t):
    expected = sbh(s, b, h) * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
    assert activation_bytes_per_layer(s, b, h, a, t=t) == expected


@pytest.mark.parametrize("s, b, h, a, t", GRID)
def test_sequence_parallel_divides_the_whole_layer_by_t(s, b, h, a, t):
    expected = Fraction(sbh(s, b, h), t) * (34 + Fraction(5 * a * s, h))
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True) == expected


@pytest.mark.parametrize("s, b, h, a, t", GRID)
def test_selective_recomputation_removes_the_5as_over_h_term(s, b, h, a, t):
    assert activation_bytes_per_layer(s, b, h, a, recompute="selective") == 34 * sbh(s, b, h)
    assert activation_bytes_per_layer(s, b, h, a, t=t, recompute="selective") == \
        sbh(s, b, h) * (10 + Fraction(24, t))
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute="selective") == \
        Fraction(34 * sbh(s, b, h), t)


@pytest.mark.parametrize("s, b, h, a, t", GRID)
def test_full_recomputation_keeps_only_the_layer_input_2sbh(s, b, h, a, t):
    assert activation_bytes_per_layer(s, b, h, a, t=t, recompute="full") == 2 * sbh(s, b, h)
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute="full") == \
        Fraction(2 * sbh(s, b, h), t)
    assert activation_terms(s, b, h, a, recompute="full") == {"layer.input": 2 * sbh(s, b, h)}


@exact
@given(layers(), st.booleans(), st.sampled_from(mm.RECOMPUTE), st.sampled_from([1, 2, 4, 8]))
def test_bytes_per_layer_are_the_sum_of_the_itemized_terms(layer, sequence_parallel, recompute, value):
    s, b, h, a, t, g = layer
    options = dict(t=t, sequence_parallel=sequence_parallel, recompute=recompute, num_query_groups=g,
                   bytes_per_value=value, bytes_per_mask=1)
    assert activation_bytes_per_layer(s, b, h, a, **options) == \
        sum(activation_terms(s, b, h, a, **options).values())


@exact
@given(layers())
def test_closed_forms_hold_for_any_shape_that_divides(layer):
    s, b, h, a, t, _ = layer
    eq1 = sbh(s, b, h) * (34 + Fraction(5 * a * s, h))
    assert activation_bytes_per_layer(s, b, h, a) == eq1
    assert activation_bytes_per_layer(s, b, h, a, t=t) == \
        sbh(s, b, h) * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True) == eq1 / t
    assert activation_bytes_per_layer(s, b, h, a, t=t, sequence_parallel=True, recompute="selective") == \
        Fraction(34 * sbh(s, b, h), t)


def test_terms_are_the_papers_list_in_forward_order():
    assert list(activation_terms(8, 1, 16, 2)) == [
        "layernorm1.input", "attention.qkv_input", "attention.q", "attention.k", "attention.v",
        "attention.softmax_output", "attention.softmax_dropout_mask", "attention.softmax_dropout_output",
        "attention.projection_input", "attention.dropout_mask",
        "layernorm2.input", "mlp.input", "mlp.gelu_input", "mlp.gelu_output", "mlp.dropout_mask"]


def test_attention_block_keeps_11sbh_plus_5as2b_and_mlp_19sbh_as_in_section_4_1():
    s, b, h, a = 32, 2, 16, 4
    terms = activation_terms(s, b, h, a)
    attention = sum(v for k, v in terms.items() if k.startswith("attention."))
    mlp = sum(v for k, v in terms.items() if k.startswith("mlp."))
    norms = sum(v for k, v in terms.items() if k.startswith("layernorm"))
    assert attention == 11 * sbh(s, b, h) + 5 * a * s * s * b
    assert (mlp, norms) == (19 * sbh(s, b, h), 4 * sbh(s, b, h))


def test_selective_recomputation_drops_exactly_the_three_attention_score_tensors():
    full = activation_terms(16, 2, 8, 2)
    selective = activation_terms(16, 2, 8, 2, recompute="selective")
    assert set(full) - set(selective) == set(mm.ATTENTION_SCORES)
    assert all(selective[name] == full[name] for name in selective)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallelism_leaves_10sbh_replicated_without_sequence_parallelism(sequence_parallel):
    s, b, h, a, t = 16, 2, 32, 8, 4
    one = activation_terms(s, b, h, a)
    split = activation_terms(s, b, h, a, t=t, sequence_parallel=sequence_parallel)
    replicated = {name for name in one if split[name] == one[name]}
    expected = set() if sequence_parallel else {
        "layernorm1.input", "attention.qkv_input", "attention.dropout_mask",
        "layernorm2.input", "mlp.input", "mlp.dropout_mask"}
    assert replicated == expected
    assert all(split[name] * t == one[name] for name in one if name not in replicated)
    assert sum(one[name] for name in expected) == (10 * sbh(s, b, h) if expected else 0)


# ---- GQA and data types ----

@pytest.mark.parametrize("g", [1, 2, 4])
def test_gqa_shrinks_exactly_k_and_v_by_g_over_a(g):
    s, b, h, a = 32, 2, 64, 8
    mha = activation_terms(s, b, h, a)
    gqa = activation_terms(s, b, h, a, num_query_groups=g)
    changed = {name for name in mha if gqa[name] != mha[name]}
    assert changed == {"attention.k", "attention.v"}
    assert all(gqa[name] * a == mha[name] * g for name in changed)


def test_gqa_under_tensor_parallelism_splits_the_groups_over_the_ranks():
    s, b, h, a, g, t = 16, 1, 64, 8, 4, 2
    split = activation_terms(s, b, h, a, t=t, num_query_groups=g)
    assert split["attention.k"] == 2 * s * b * (g // t) * (h // a)


def test_num_query_groups_equal_to_heads_is_ordinary_multi_head_attention():
    assert activation_terms(16, 2, 32, 4, num_query_groups=4) == activation_terms(16, 2, 32, 4)


@pytest.mark.parametrize("value", [4, 8])
def test_wider_values_scale_the_values_but_not_the_masks(value):
    s, b, h, a = 16, 2, 32, 4
    half = activation_terms(s, b, h, a)
    wide = activation_terms(s, b, h, a, bytes_per_value=value)
    for name in half:
        factor = 1 if name.endswith("_mask") else value // 2
        assert wide[name] == factor * half[name], name


def test_float32_layer_is_sbh_66_plus_9as_over_h():
    # 32 bytes of values become 64 and 2 of masks stay 2; the scores' 4 + 1 become 8 + 1
    s, b, h, a = 64, 2, 32, 4
    assert activation_bytes_per_layer(s, b, h, a, bytes_per_value=4) == \
        sbh(s, b, h) * (66 + Fraction(9 * a * s, h))


# ---- the paper's numbers ----

def test_gpt3_selective_recomputation_removes_70_percent_of_activation_memory():
    assert 5 * 96 * 2048 / 12288 == 80
    assert round(mm.selective_savings(2048, 96, 12288), 2) == 0.70


def test_mt_nlg_selective_recomputation_removes_65_percent_of_activation_memory():
    assert 5 * 128 * 2048 / 20480 == 64
    assert round(mm.selective_savings(2048, 128, 20480), 2) == 0.65


def test_selective_recomputation_costs_2_7_and_1_6_percent_extra_flops_for_gpt3_and_mt_nlg():
    assert round(mm.selective_flops_overhead(2048, 12288, 96, 51200), 3) == 0.027
    assert round(mm.selective_flops_overhead(2048, 20480, 105, 51200), 3) == 0.016


def test_paper_table_lists_the_table_3_configurations():
    rows = [(r.model.name, r.model.a, r.model.h, r.model.num_layers, r.model.t, r.model.p, r.model.gpus,
             r.model.global_batch, r.model.b, r.model.s) for r in mm.paper_table()]
    assert rows == [
        ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 2048),
        ("175B (GPT-3)", 96, 12288, 96, 8, 8, 64, 64, 1, 2048),
        ("530B (MT-NLG)", 128, 20480, 105, 8, 35, 280, 280, 1, 2048),
        ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 2048),
    ]


def test_paper_table_per_layer_columns_are_table_2_at_each_model():
    for row in mm.paper_table():
        m = row.model
        unit, scores = sbh(m.s, m.b, m.h), Fraction(5 * m.a * m.s, m.h)
        assert row.per_layer == {
            "no parallelism": unit * (34 + scores),
            "tensor parallel": unit * (10 + Fraction(24, m.t) + scores / m.t),
            "tensor + sequence parallel": unit * (34 + scores) / m.t,
            "tensor parallel + selective": unit * (10 + Fraction(24, m.t)),
            "tensor + sequence parallel + selective": unit * Fraction(34, m.t),
            "full recomputation": 2 * unit,
        }, m.name


def test_first_pipeline_stage_holds_L_layers_times_the_interleaving_factor():
    held = {r.model.name: r.layers_in_flight for r in mm.paper_table()}
    # 175B: 96(1 + 7/24) = 124; 530B: 105(1 + 34/105) = 139; 22B and 1T: no interleaving
    assert held == {"22B": 48, "175B (GPT-3)": 124, "530B (MT-NLG)": 139, "1T": 128}
    for row in mm.paper_table():
        assert row.first_stage["tensor + sequence parallel + selective"] == \
            34 * sbh(row.model.s, row.model.b, row.model.h) * row.layers_in_flight // row.model.t  # Eq. 6


def test_figure_7_sequence_parallel_and_selective_together_cut_memory_about_5x():
    for row in mm.paper_table():
        percent = row.percent_of_baseline
        assert percent["tensor parallel"] == 100
        assert 45 < percent["tensor + sequence parallel"] < 70  # "individually ... nearly in half"
        assert 45 < percent["tensor parallel + selective"] < 70
        assert 4.5 < 100 / percent["tensor + sequence parallel + selective"] < 6.5  # "a 5x reduction"
        assert 7 < percent["full recomputation"] < 10  # "full activation recomputation ... at 10%"


def test_figure_7_percentages_for_gpt3():
    percent = mm.paper_table()[1].percent_of_baseline  # baseline sbh(10 + 3 + 10) = 23 sbh
    assert percent["tensor + sequence parallel"] == pytest.approx(100 * 14.25 / 23)
    assert percent["tensor parallel + selective"] == pytest.approx(100 * 13 / 23)
    assert percent["tensor + sequence parallel + selective"] == pytest.approx(100 * 4.25 / 23)
    assert percent["full recomputation"] == pytest.approx(100 * 2 / 23)


def test_appendix_b_output_deallocation_saves_2_73_gib_on_the_first_stage_of_530b():
    row = mm.paper_table()[2]
    assert row.deallocation_savings == 2 * 2048 * 1 * 20480 * 35
    assert mm.format_bytes(row.deallocation_savings) == "2.73 GiB"


def test_section_4_3_extra_activations_are_under_one_percent_of_eq_5():
    # The paper says "less than 0.01%" for 22B; its own formula gives 0.57% (p = 1 adds the fp32 logits)
    for row in mm.paper_table():
        assert row.extra < row.first_stage["tensor + sequence parallel"] / 100, row.model.name
    twenty_two = mm.paper_table()[0]
    assert round(twenty_two.extra / twenty_two.first_stage["tensor + sequence parallel"], 4) == 0.0057


# ---- a stack of layers: NeMo's recomputation options ----

S, B, H, A, L = 32, 2, 16, 4, 8
F = activation_bytes_per_layer(S, B, H, A)
X = activation_bytes_per_layer(S, B, H, A, recompute="full")


def test_stack_without_recomputation_keeps_every_layer():
    assert activation_bytes(L, S, B, H, A) == L * F


def test_stack_with_selective_recomputation_keeps_34sbh_per_layer():
    assert activation_bytes(L, S, B, H, A, granularity="selective") == L * 34 * sbh(S, B, H)


@pytest.mark.parametrize("n, peak", [
    (1, 7 * X + F),       # 8 kept inputs; the top layer replayed, its input counted once
    (2, 3 * X + 2 * F),   # 4 chunks
    (3, X + 3 * F),       # chunks of 3, 3, 2: the peak is the middle chunk replayed
    (8, 8 * F),           # one chunk: everything is replayed at once, as without recomputation
])
def test_uniform_full_recomputation_keeps_chunk_inputs_and_replays_one_chunk(n, peak):
    assert activation_bytes(L, S, B, H, A, granularity="full", method="uniform",
                            num_layers_checkpointed=n) == peak


@pytest.mark.parametrize("n, peak", [
    (1, X + 7 * F),
    (5, 5 * X + 3 * F),
    (8, 7 * X + F),  # every layer recomputed: the same as uniform with one layer per chunk
])
def test_block_full_recomputation_recomputes_the_first_n_layers_and_keeps_the_rest(n, peak):
    assert activation_bytes(L, S, B, H, A, granularity="full", method="block",
                            num_layers_checkpointed=n) == peak


def test_full_recomputation_with_sequence_parallelism_keeps_inputs_split_over_t():
    t = 4
    f = activation_bytes_per_layer(S, B, H, A, t=t, sequence_parallel=True)
    assert activation_bytes(L, S, B, H, A, t=t, sequence_parallel=True, granularity="full") == \
        (L - 1) * 2 * sbh(S, B, H) // t + f


# ---- bad configurations ----

@pytest.mark.parametrize("kwargs, message", [
    (dict(h=30, a=4), r"hidden size h=30 is not divisible by a=4 heads"),
    (dict(a=8, num_query_groups=3), r"a=8 heads are not divisible by num_query_groups=3"),
    (dict(a=4, t=8), r"a=4 heads cannot be split over t=8"),
    (dict(a=8, num_query_groups=2, t=4), r"num_query_groups=2 key/value groups cannot be split over t=4"),
    (dict(s=10, t=4, sequence_parallel=True), r"sequence length s=10 cannot be split over t=4"),
    (dict(s=0), r"s must be a positive integer, got 0"),
    (dict(b=-1), r"b must be a positive integer, got -1"),
    (dict(h=16.0), r"h must be a positive integer, got 16.0"),
    (dict(num_query_groups=0), r"num_query_groups must be a positive integer, got 0"),
    (dict(bytes_per_value=0), r"bytes_per_value must be a positive integer, got 0"),
    (dict(recompute="ful"), r"recompute must be None, 'selective' or 'full', got 'ful'"),
    (dict(sequence_parallel="yes"), r"sequence_parallel must be True or False"),
])
def test_bad_configurations_raise_errors_naming_the_values(kwargs, message):
    args = dict(s=16, b=2, h=32, a=8)
    args.update(kwargs)
    s, b, h, a = args.pop("s"), args.pop("b"), args.pop("h"), args.pop("a")
    with pytest.raises(ValueError, match=r"activation_bytes_per_layer: " + message):
        activation_bytes_per_layer(s, b, h, a, **args)
    with pytest.raises(ValueError, match=r"activation_terms: " + message):
        activation_terms(s, b, h, a, **args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(granularity="layer"), r"granularity must be None, 'selective' or 'full', got 'layer'"),
    (dict(granularity="full", method="sqrt"), r"method must be 'uniform' or 'block', got 'sqrt'"),
    (dict(granularity="full", num_layers_checkpointed=0), r"num_layers_checkpointed must be a positive"),
    (dict(granularity="full", num_layers_checkpointed=9), r"num_layers_checkpointed=9 is more than the "
                                                          r"num_layers=8"),
    (dict(h=30), r"hidden size h=30 is not divisible by a=4 heads"),
])
def test_bad_stack_configurations_raise_errors_naming_the_values(kwargs, message):
    args = dict(h=H)
    args.update(kwargs)
    with pytest.raises(ValueError, match=r"activation_bytes: " + message):
        activation_bytes(L, S, B, args.pop("h"), A, **args)


def test_layers_in_flight_refuses_stages_that_do_not_divide():
    with pytest.raises(ValueError, match=r"num_layers=10 cannot be split over p=4 pipeline stages"):
        mm.layers_in_flight(10, 4)
    with pytest.raises(ValueError, match=r"the 4 layers of a stage cannot be cut into interleaving_stages=3"):
        mm.layers_in_flight(16, 4, interleaving_stages=3)


def test_format_bytes_uses_binary_units():
    assert [mm.format_bytes(n) for n in (512, 1536, 3 * 2**20, 2**30)] == \
        ["512 B", "1.50 KiB", "3.00 MiB", "1.00 GiB"]
