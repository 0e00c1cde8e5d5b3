"""Findings: each distinct problem once, with the cells that show it, from any set of results."""

from __future__ import annotations

from harness.findings import Finding, compute_findings, leads, verdict_signature
from harness.result import ScenarioResult
from harness.verdict import Verdict


def _cell(scenario: str, topology: str, transport: str, *verdicts: Verdict, connector: str = "mooncake",
          duration: float = 5.0) -> ScenarioResult:
    replay = f"pdchaos run {scenario} --topology {topology} --transport {transport}"
    ok = [Verdict.ok("run_complete"), Verdict.ok("faults")]
    return ScenarioResult(scenario, topology, connector, transport, router="gw", verdicts=[*ok, *verdicts],
                          replay=replay, duration_s=duration)


def _legs(n: int = 2) -> Verdict:
    return Verdict.fail("legs_once", f"{n} request leg(s) ran more than once on an engine (run again)",
                        evidence=[f"router side: [x:{n}] reached the decodes 2 times"])


def _params() -> Verdict:
    return Verdict.fail("handoff_params", "3 handoff parameter(s) not what the contract derives",
                        evidence=["router side: [x:1]: minted aaaa at t=1.0, but prefill-0 serves as bbbb"])


def _stale() -> Verdict:
    return Verdict.fail("handoff", "bad handoffs: 4 stale_engine_id", {"problems": {"stale_engine_id": 4}},
                        evidence=[{"problem": "stale_engine_id", "side": "router", "why": "told aa"}])


def _availability(kind: str = "restart") -> Verdict:
    return Verdict.fail("availability", f"{kind} after: 0.50 < 0.95 (failed: 1, 2)")


def _recovery(kind: str) -> Verdict:
    return Verdict.fail("recovery", f"{kind}: no correct handoff through prefill-1 within 5.0s of heal")


def test_one_problem_in_many_cells_is_one_finding_naming_every_cell_and_the_clean_ones() -> None:
    results = [
        _cell("late_pull", "1p1d", "http", _legs(8)),
        _cell("late_pull", "1p1d", "grpc"),
        _cell("prefill_fails", "1p1d", "http", _legs(3)),
        _cell("prefill_fails", "2p1d", "http", _legs(1)),
    ]
    [f] = compute_findings(results, known={})
    assert f.checker == "legs_once" and f.side == "router"
    assert f.cells == ["late_pull[1p1d/mooncake/http]", "prefill_fails[1p1d/mooncake/http]",
                       "prefill_fails[2p1d/mooncake/http]"]
    assert f.clean_cells == ["late_pull[1p1d/mooncake/grpc]"]
    assert "ran the request again" in f.title and f.title.endswith("(router side)")
    assert f.evidence and f.evidence[0].startswith("router side:")
    assert f.replay == "pdchaos run late_pull --topology 1p1d --transport http"


def test_passing_and_unknown_cells_give_no_finding() -> None:
    results = [_cell("a", "1p1d", "http"),
               _cell("b", "1p1d", "http", Verdict.unknown_("recovery", "no fault healed"))]
    assert compute_findings(results, known={}) == []


def test_a_contract_rule_leads_and_its_consequences_in_the_cell_follow_it() -> None:
    results = [_cell("restart", "1p1d", "http", _params(), _stale(), _availability(), _recovery("restart"))]
    [f] = compute_findings(results, known={})
    assert f.checker == "handoff_params"
    assert f.consequences == ["handoff: stale_engine_id", "availability: after: # < #",
                              "recovery: no correct handoff through <engine> within #s of heal"]


def test_a_leg_run_twice_explains_no_stale_id_so_both_are_findings() -> None:
    results = [_cell("restart", "1p1d", "http", _legs(), _stale(), _availability()),
               _cell("late_pull", "1p1d", "http", _legs())]
    found = compute_findings(results, known={})
    assert [f.checker for f in found] == ["legs_once", "handoff"]
    assert found[1].consequences == ["availability: after: # < #"]
    assert found[1].reason_class == "stale_engine_id"


def test_a_leg_run_twice_explains_the_latency_it_adds() -> None:
    slow = Verdict.fail("latency", "successful requests held up past 0.6s during a fault")
    [f] = compute_findings([_cell("retry", "1p2d", "http", _legs(), slow)], known={})
    assert f.checker == "legs_once" and f.consequences == [
        "latency: successful requests held up past #s during a fault"]


def test_symptoms_alone_are_led_by_the_strongest_and_fault_kinds_do_not_split_them() -> None:
    lost = Verdict.fail("nothing_lost", "1 of 40 request(s) lost")
    results = [_cell("partition", "2p1d", "http", _recovery("cut")),
               _cell("blip", "2p1d", "http", _recovery("blip")),
               _cell("hang", "1p2d", "grpc", _availability("hang"), lost)]
    found = compute_findings(results, known={})
    assert [(f.checker, len(f.cells)) for f in found] == [("recovery", 2), ("nothing_lost", 1)]
    assert found[1].consequences == ["availability: after: # < #"]


def test_a_view_seen_only_where_a_contract_rule_failed_folds_into_it() -> None:
    reported = Verdict.fail("reported_engine_id", "1 engine id change(s) not shown in time")
    results = [_cell("restart", "1p1d", "http", _params(), reported),
               _cell("restart", "1p2d", "http", _params()),
               _cell("promotion", "1p1d", "grpc", _params())]
    [f] = compute_findings(results, known={})
    assert f.checker == "handoff_params" and len(f.cells) == 3
    assert "reported_engine_id: # engine id change not shown in time" in f.consequences


def test_a_view_seen_alone_somewhere_stays_its_own_finding() -> None:
    reported = Verdict.fail("reported_engine_id", "1 engine id change(s) not shown in time")
    results = [_cell("restart", "1p1d", "http", _params(), reported),
               _cell("restart", "1p1d", "grpc", reported)]
    assert sorted(f.checker for f in compute_findings(results, known={})) == ["handoff_params",
                                                                             "reported_engine_id"]


def test_a_mechanism_seen_only_where_its_symptom_shows_folds_into_the_symptom() -> None:
    wrong = Verdict.fail("output", "2 completion(s) with wrong output")
    contract = Verdict.fail("request_contract", "1 request(s) not handled as the request contract says",
                            evidence=["router side: [x:1] got 200 with an error"])
    results = [_cell("a", "1p2d", "http", wrong, contract), _cell("b", "1p1d", "http", wrong),
               _cell("c", "1p1d", "grpc", wrong)]
    [f] = compute_findings(results, known={})
    assert f.checker == "output" and len(f.cells) == 3
    assert f.consequences == ["request_contract: # request not handled as the request contract says"]


def test_the_replay_is_the_smallest_cell_and_the_strict_handoff_is_the_handoff() -> None:
    strict = Verdict.fail("handoff_strict", "bad handoffs outside grace windows: 2 stale_engine_id",
                          {"problems": {"stale_engine_id": 2}})
    results = [_cell("r", "2p1d", "http", _stale(), duration=3.0), _cell("r", "1p1d", "http", strict)]
    [f] = compute_findings(results, known={})
    assert f.signature == "handoff: stale_engine_id" and f.replay.endswith("--topology 1p1d --transport http")


def test_known_signatures_name_the_switches_whose_symptom_it_is() -> None:
    known = {"retry_failed_requests": ["legs_once: # request leg ran more than once on an engine"],
             "stale_engine_id": ["handoff: stale_engine_id"]}
    [f] = compute_findings([_cell("x", "1p1d", "http", _legs())], known=known)
    assert f.switches == ["retry_failed_requests"]


def test_the_id_is_stable_and_the_finding_survives_json() -> None:
    a = compute_findings([_cell("x", "1p1d", "http", _legs(2))], known={})[0]
    b = compute_findings([_cell("y", "2p1d", "grpc", _legs(9))], known={})[0]
    assert a.id == b.id
    again = Finding.from_dict(a.to_dict())
    assert again.to_dict() == a.to_dict()


def test_verdict_signature_and_leads_ignore_the_run_s_own_verdicts() -> None:
    assert verdict_signature(Verdict.fail("timeline", "step never fired")) is None
    assert verdict_signature(Verdict.ok("legs_once")) is None
    local = Verdict.fail("no_local_compute", "2 computed locally")
    assert verdict_signature(local) == "handoff: local_compute"
    assert leads([Verdict.fail("faults", "not verified")]) == []


def test_a_search_signature_keys_as_the_same_verdict_does_in_findings() -> None:
    from harness.findings.group import search_signature_as_finding
    from harness.search.signature import signatures

    verdicts = [_availability("cut"), _recovery("restart"), _stale(), _params(),
                Verdict.fail("handoff", "bad handoffs: 2 timed_out", {"problems": {"timed_out": 2}}),
                Verdict.fail("handoff_strict", "bad handoffs: 2 stale_engine_id",
                             {"problems": {"stale_engine_id": 2}})]
    for v, sig in zip(verdicts, signatures(verdicts), strict=True):
        assert search_signature_as_finding(sig.checker, sig.reason) == verdict_signature(v), v


def test_cells_by_signature_names_the_cells_of_leads_and_consequences() -> None:
    from harness.findings.delta import cells_by_signature

    results = [_cell("r", "1p1d", "http", _params(), _stale()), _cell("r", "2p1d", "http", _params())]
    [f] = compute_findings(results, known={})
    shown = cells_by_signature([f])
    assert shown[f.signature] == f.cells and len(f.cells) == 2
    assert all(shown[c] == f.cells for c in f.consequences) and f.consequences


def test_a_search_passes_by_a_known_lead_and_what_it_absorbs_but_not_a_new_lead() -> None:
    from harness.findings.group import absorbed_by_lead, unknown_signatures
    from harness.search.signature import signatures

    stale = Verdict("handoff_params", "fail", "6 handoff parameter(s) not what the contract derives",
                    evidence=["router side: decode-0 was told an old id"])
    down = Verdict("availability", "fail", "f0_restart after: 0.000 < 0.95 (failed: 15)")
    shape = Verdict("leg_shape", "fail", "3 of 30 legs not shaped as the contract says: prefill streamed",
                    evidence=["router side: a leg"])
    absorbed = absorbed_by_lead([stale, down])
    (lead, below), = absorbed
    assert lead == "handoff_params: # handoff parameter not what the contract derives"
    assert below == ("availability: <fault> after: # < #",)
    known = frozenset({lead})
    # The symptom a known lead explains is known too; without the grouping it would read as new.
    assert unknown_signatures(signatures([stale, down]), known, absorbed) == []
    assert [s.checker for s in unknown_signatures(signatures([stale, down]), known)] == ["availability"]
    # A second lead of its own is new, whatever it absorbs.
    runs = [stale, down, shape]
    assert [s.checker for s in unknown_signatures(signatures(runs), known, absorbed_by_lead(runs))] == [
        "leg_shape"]
