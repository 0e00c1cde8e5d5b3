"""Sweep files: the TOML format, every problem named, the shipped sweeps found by name."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from harness.sweep.spec import SWEEP_DIR, RouterChoice, SweepError, find_sweep, load_sweep, parse_sweep


def parse(text: str):
    return parse_sweep(tomllib.loads(text), Path("/nowhere/x.toml"))


def test_a_full_file_is_read_with_its_axes_exclusions_bugs_and_thresholds() -> None:
    spec = parse("""
        [sweep]
        name = "s"
        seed = 3
        jobs = 2
        [axes]
        scenarios = ["default", "sole_prefill_down"]
        topologies = ["1P2D", "2p2d"]
        extend_topologies = true
        connectors = ["nixl"]
        routers = ["reference", {spec = "smg==1.10", label = "old"}]
        worlds = ["real", "sim"]
        settings = ["scaled"]
        [[exclude]]
        scenario = "sole_prefill_down"
        topology = ["2p2d"]
        reason = "not a sole leg"
        [bugs]
        prefill_restart_mooncake = "stale_engine_id"
        [compare]
        ttft_rel = 0.5
        resamples = 100
    """)
    assert (spec.name, spec.seed, spec.jobs) == ("s", 3, 2)
    assert spec.topologies == ("1p2d", "2p2d")
    assert spec.extend_topologies
    # A version is a string in TOML: no 1.10 -> 1.1 surprise.
    assert spec.routers == (RouterChoice("reference", "reference"), RouterChoice("smg==1.10", "old"))
    assert spec.worlds == ("real", "sim")
    assert spec.exclude[0].matches({"scenario": "sole_prefill_down", "topology": "2p2d"})
    assert not spec.exclude[0].matches({"scenario": "sole_prefill_down", "topology": "1p1d"})
    assert "not a sole leg" in spec.exclude[0].describe()
    assert spec.bugs == {"prefill_restart_mooncake": ("stale_engine_id",)}
    assert spec.thresholds.ttft_rel == 0.5 and spec.thresholds.resamples == 100


def test_defaults_are_the_default_suite_on_loopback_with_the_reference_router() -> None:
    spec = parse("")
    assert spec.name == "x"
    assert spec.scenarios == ("default",)
    assert spec.worlds == ("real",) and spec.engines == ("local",)
    assert spec.topologies is None and spec.settings is None


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[axes]\nworlds = ['moon']", "unknown world 'moon'"),
        ("[axes]\ntopologies = ['3x3']", "3x3"),
        ("[axes]\nconnectors = []", "connectors is empty"),
        ("[axes]\nsettings = ['fast']", "unknown setting 'fast'"),
        ("[axes]\nrouters = ['nginx']", "nginx"),
        ("[axes]\nrouters = ['reference', {spec = 'reference'}]", "two routers labelled 'reference'"),
        ("[axes]\nengines = ['gpu']", "engine backend 'gpu' has no [engines.gpu] table"),
        ("[axes]\nextend_topologies = true", "extend_topologies needs"),
        ("[axes]\ncolour = ['red']", "unknown key 'colour' in [axes]"),
        ("[sweep]\njobs = 0", "jobs must be at least 1"),
        ("[sweep]\nseed = -3", "a seed is a whole number from 0 to 4294967295, not -3"),
        ("[sweep]\nseed = 'one'", "not 'one'"),
        ("[[exclude]]\nreason = 'x'", "names no axis"),
        ("[[exclude]]\nplanet = 'mars'", "unknown key 'planet' in [[exclude]]"),
        ("[compare]\nttft_rel = -1", "[compare] ttft_rel must be a number >= 0"),
        ("[engines.gpu]\nbackend = 'slurm'", "needs backend = \"k8s\""),
        ("[engines.gpu]\nbackend = 'k8s'\npreset = 'tpu'", "preset must be one of"),
        ("[engines.gpu]\nbackend = 'k8s'\npreset = 'vllm-nixl-gpu'\nrouter = 'outside'", "outside router"),
    ],
)
def test_every_problem_is_named(text: str, needle: str) -> None:
    with pytest.raises(SweepError) as e:
        parse(text)
    assert needle in str(e.value)


def test_several_problems_are_reported_at_once() -> None:
    with pytest.raises(SweepError) as e:
        parse("[axes]\nworlds = ['moon']\ntransports = ['smoke']")
    assert "moon" in str(e.value) and "smoke" in str(e.value)


def test_shipped_sweeps_are_found_by_name_and_load(tmp_path: Path) -> None:
    names = sorted(p.stem for p in SWEEP_DIR.glob("*.toml"))
    assert {"ci-regression", "gpu-cluster", "gateway-release"} <= set(names)
    for name in names:
        assert load_sweep(name).name == name
    assert find_sweep("gpu-cluster.toml") == SWEEP_DIR / "gpu-cluster.toml"
    with pytest.raises(SweepError, match="no sweep file 'nope'"):
        find_sweep("nope")


def test_a_file_that_is_not_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[axes\n", encoding="utf-8")
    with pytest.raises(SweepError, match=r"bad\.toml: not TOML"):
        load_sweep(str(bad))
    bad.write_bytes(b"\xff\xfe[axes]\n")
    with pytest.raises(SweepError, match=r"bad\.toml: not TOML: not UTF-8 text \(byte 0\)"):
        load_sweep(str(bad))
