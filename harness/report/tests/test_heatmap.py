"""Which axes each op family is drawn over, what a cell says, and that a drawing is a PNG."""

import math
from types import SimpleNamespace

import pytest

from attncheck_report.heatmap import Cell, grid, plan_heatmap, ratio_label, render_heatmap
from png_check import check_png
from synthetic import ATTNCHECK_FAILING


def case(op, arch="gfx942", verdict="passed", ratio=0.1, **params):
    params.setdefault("seed", 0)
    return SimpleNamespace(op=op, arch=arch, verdict=verdict, ratio=ratio, params=params,
                           failing=verdict in ATTNCHECK_FAILING)


def cross(op, **axes):
    out = [{}]
    for name, values in axes.items():
        out = [dict(o, **{name: v}) for o in out for v in values]
    return [case(op, **p) for p in out]


def test_mla_decode_heads_by_block_size_panels_per_qlen():
    plan = plan_heatmap("mla_decode", cross("mla_decode", heads=[4, 16, 128], block_size=[1, 64],
                                            qlen=[1, 8], dtype=["bf16"], ctx=[100, 1023]))
    assert (plan.rows, plan.cols, plan.panels) == ("heads", "block_size", "qlen")
    assert plan.folded == ["ctx"] and not plan.generic


def test_mla_decode_panels_fall_back_to_dtype_when_qlen_does_not_vary():
    plan = plan_heatmap("mla_decode", cross("mla_decode", heads=[4, 16], block_size=[1, 64],
                                            qlen=[1], dtype=["bf16", "fp8"]))
    assert plan.panels == "dtype"


def test_indexer_block_size_by_layout_panels_per_format():
    plan = plan_heatmap("indexer_k_cache", cross("indexer_k_cache", block_size=[1, 64],
                                                 layout=["normal", "shuffle"],
                                                 fp8_format=["e4m3fn", "e4m3fnuz"]))
    assert (plan.rows, plan.cols, plan.panels) == ("layout", "block_size", "fp8_format")


def test_indexer_without_a_layout_axis_takes_rows_by_the_generic_rule():
    plan = plan_heatmap("indexer_k_cache", cross("indexer_k_cache", block_size=[1, 16, 64],
                                                 fp8=["e4m3fn", "e4m3fnuz"], pad=[0, 4, 100, 132],
                                                 tokens=[40]))
    assert (plan.rows, plan.cols, plan.panels) == ("pad", "block_size", "fp8")
    assert plan.generic == ["pad"]


def test_decode_attention_lk_lv_is_derived_from_lk_and_lv():
    cases = [case("decode_attention", lk=lk, lv=lv, page_size=ps)
             for lk, lv in [(576, 512), (128, 128), (320, 256)] for ps in (1, 16)]
    plan = plan_heatmap("decode_attention", cases)
    assert (plan.rows, plan.cols) == ("lk_lv", "page_size")
    assert "lk" not in plan.folded and "lv" not in plan.folded
    (_, _, rows, cols, _), = grid(plan, cases)
    assert rows == ["128/128", "320/256", "576/512"] and cols == [1, 16]


def test_kv_gather_layout_by_cache_dtype():
    plan = plan_heatmap("kv_gather", cross("kv_gather", layout=["nhd", "shuffle"],
                                           kv=["model", "e4m3fn"],
                                           strides=["contiguous", "hybrid"]))
    assert (plan.rows, plan.cols, plan.panels) == ("layout", "kv", "strides")


def test_rope_style_by_contract_and_the_indexer_rope_by_path():
    plan = plan_heatmap("rope", cross("rope", style=["neox", "gptj"],
                                      contract=["inplace", "out_of_place"]))
    assert (plan.rows, plan.cols) == ("style", "contract")
    plan = plan_heatmap("indexer_qk_rope", cross("indexer_qk_rope", style=["neox", "gptj"],
                                                 path=["generic", "fast"], heads=[8, 32, 64]))
    assert (plan.rows, plan.cols) == ("style", "path")


def test_unknown_op_uses_the_two_axes_with_most_values_and_never_seed_first():
    cases = cross("brand_new_op", a=[1, 2], b=[1, 2, 3, 4], c=[1, 2, 3], seed=[0, 1, 2, 3, 4, 5])
    plan = plan_heatmap("brand_new_op", cases)
    assert (plan.rows, plan.cols, plan.panels) == ("b", "c", None) and plan.generic == ["b", "c"]
    assert plan.folded == ["a", "seed"]


def test_arches_are_separate_panels():
    cases = cross("rope", style=["neox"], contract=["inplace"])
    cases.append(case("rope", arch="gfx950", style="neox", contract="inplace"))
    assert [p[0] for p in grid(plan_heatmap("rope", cases), cases)] == ["gfx942", "gfx950"]


def test_cell_state_and_ratio():
    cell = Cell([case("x", ratio=0.2), case("x", verdict="failed", ratio=None),
                 case("x", verdict="known_bug", ratio=9.0)])
    assert cell.state == "fail" and cell.ratio == 9.0
    assert Cell([case("x", verdict="refused_as_expected", ratio=None)]).state == "refused"
    assert Cell([case("x", verdict="unexpected_pass"), case("x")]).state == "unexpected_pass"


def test_cell_state_follows_the_failing_field():
    # The record's "failing" decides the cross, not the verdict's name.
    marked = case("x", verdict="unexpected_pass")
    marked.failing = True
    assert Cell([marked, case("x")]).state == "fail"
    unmarked = case("x", verdict="failed", ratio=None)
    unmarked.failing = False
    assert Cell([unmarked]).state != "fail"
    # unsupported (the kernel declined) reads like skipped: nothing compared.
    assert Cell([case("x", verdict="unsupported", ratio=None)]).state == "skipped"


@pytest.mark.parametrize("value,text", [(None, ""), (math.inf, "∞"), (0.0, "0"), (37.2, "37"),
                                        (0.5, "0.5"), (0.0071, "0.0071"), (3e-5, "3e-5"),
                                        (250.0, "250")])
def test_ratio_label(value, text):
    assert ratio_label(value) == text


def test_render_is_a_png():
    cases = cross("mla_decode", heads=[4, 8], block_size=[1, 16], qlen=[1, 3])
    cases[0].verdict, cases[0].ratio, cases[0].failing = "failed", math.inf, True
    png = render_heatmap(plan_heatmap("mla_decode", cases), cases)
    width, height = check_png(png)
    assert width > 300 and height > 150
