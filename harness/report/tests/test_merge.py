"""Merging the shards of one run into one results directory."""

import json
import xml.etree.ElementTree as ET

import pytest

import synthetic
from attncheck_report.merge import merge
from attncheck_report.results import ResultsError, load_run

JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="attncheck" tests="{n}" failures="{f}" errors="0" skipped="0">
{cases}</testsuite></testsuites>"""


def shard(tmp_path, name, records, index, **meta):
    d = synthetic.write_results(tmp_path / name, records, shard=f"{index}/2", **meta)
    cases = "".join(f'<testcase classname="{r["op"]}" name="{r["id"]}"/>\n' for r in records)
    failed = sum(r["verdict"] == "failed" for r in records)
    (d / "junit.xml").write_text(JUNIT.format(n=len(records), f=failed, cases=cases))
    return d


def test_merge_two_shards(tmp_path):
    records = synthetic.other_cases("gfx950")
    a = shard(tmp_path, "s0", records[::2], 0, started="2026-01-01T10:00:00Z", wall_s=10.0)
    b = shard(tmp_path, "s1", records[1::2], 1, started="2026-01-01T09:59:00Z", wall_s=30.0)
    (b / "repro").mkdir()
    (b / "repro" / "kv_gather__x.h5").write_bytes(b"bundle")
    summary = merge([a, b], tmp_path / "m")
    assert summary["cases"] == len(records) and summary["warnings"] == []
    run = load_run(tmp_path / "m")
    assert sorted(c.id for c in run.cases) == sorted(r["id"] for r in records)
    assert run.warnings == []  # case_count is the sum
    assert run.meta["started"] == "2026-01-01T09:59:00Z" and run.meta["wall_s"] == 30.0
    assert run.meta["shard"] == "merged" and len(run.meta["merged_from"]) == 2
    root = ET.parse(tmp_path / "m" / "junit.xml").getroot()
    assert root.get("tests") == str(len(records))
    assert root.get("failures") == str(sum(r["verdict"] == "failed" for r in records))
    assert len(root.findall("testsuite/testcase")) == len(records)
    assert (tmp_path / "m" / "repro" / "kv_gather__x.h5").read_bytes() == b"bundle"


def test_unfinished_shard_leaves_the_merge_unfinished(tmp_path):
    records = synthetic.other_cases("gfx942")
    a = shard(tmp_path, "s0", records[:3], 0)
    b = shard(tmp_path, "s1", records[3:], 1, finished="")
    merge([a, b], tmp_path / "m")
    assert json.loads((tmp_path / "m" / "run.json").read_text())["finished"] == ""
    assert "did not complete" in load_run(tmp_path / "m").warnings[0]


def test_shards_of_different_runs_are_refused(tmp_path):
    records = synthetic.other_cases("gfx942")
    a = shard(tmp_path, "s0", records[:3], 0)
    b = shard(tmp_path, "s1", records[3:], 1, arch="gfx950")
    with pytest.raises(ResultsError, match="shards disagree on arch: gfx942, gfx950"):
        merge([a, b], tmp_path / "m")


def test_missing_junit_is_a_warning(tmp_path):
    a = shard(tmp_path, "s0", synthetic.other_cases("gfx942")[:2], 0)
    (a / "junit.xml").unlink()
    assert "missing, not merged" in merge([a], tmp_path / "m")["warnings"][0]


def test_broken_shard_is_refused_before_writing(tmp_path):
    a = shard(tmp_path, "s0", synthetic.other_cases("gfx942")[:2], 0)
    (a / "results.jsonl").write_text("{not json\n")
    with pytest.raises(ResultsError, match=r"results\.jsonl:1: not valid JSON"):
        merge([a], tmp_path / "m")
    assert not (tmp_path / "m" / "results.jsonl").exists()


def test_merge_sums_counts_and_timings_and_keeps_the_pools(tmp_path):
    records = synthetic.other_cases("gfx942")
    a = shard(tmp_path, "s0", records[:3], 0, compared=3, jobs=8, wall_s=40.0,
              timings_s={"generate": 1.5, "reference": 10.0, "ipc": 0.25},
              pools=[{"gpu": "0", "jobs": 8, "cases": 3, "busy_s": 39.0, "finished_s": 40.0}])
    b = shard(tmp_path, "s1", records[3:], 1, compared=2, jobs=6, wall_s=36.0,
              timings_s={"generate": 0.5, "reference": 4.0, "upload": 2.0},
              pools=[{"gpu": "1", "jobs": 6, "cases": 2, "busy_s": 30.0, "finished_s": 36.0}])
    summary = merge([a, b], tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "run.json").read_text())
    assert meta["compared"] == 5  # not one shard's count
    assert meta["case_count"] == len(records) and meta["jobs"] == 14
    assert meta["timings_s"] == {"generate": 2.0, "reference": 14.0, "ipc": 0.25, "upload": 2.0}
    assert [(p["gpu"], p["jobs"], p["shard"]) for p in meta["pools"]] == [("0", 8, "0/2"),
                                                                          ("1", 6, "1/2")]
    assert meta["wall_s"] == 40.0 and meta["shard_wall_s"] == [40.0, 36.0]
    assert meta["imbalance"] == 0.1 and summary["imbalance"] == 0.1


def test_shards_run_with_different_settings_are_refused(tmp_path):
    records = synthetic.other_cases("gfx942")
    a = shard(tmp_path, "s0", records[:3], 0, repeat=2)
    b = shard(tmp_path, "s1", records[3:], 1, repeat=3)
    with pytest.raises(ResultsError, match="shards disagree on repeat"):
        merge([a, b], tmp_path / "m")
