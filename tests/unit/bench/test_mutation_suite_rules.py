"""The stated rules `bench/mutation.py --judge suite` sets mutants aside by (bench/mutation_suite.py)."""

from __future__ import annotations

from pathlib import Path

from helpers.bench_script import load_bench

suite = load_bench("mutation_suite")

SOURCE = '''from .bugs import SWITCH, OTHER


def decide(x, bugs):
    if SWITCH in bugs:
        return "buggy"
    return "right"


class Flow:
    def step(self, bugs):
        if OTHER in bugs and self:
            y = 1
            return y
        return 2
'''
BUGS = 'SWITCH = "switch"\nOTHER = "other"\nNOT_A_SWITCH = 3\n'


def _diff(start: int, before: str, after: str, context: tuple[str, ...] = ()) -> str:
    body = "".join(f" {c}\n" for c in context) + f"-{before}\n+{after}\n"
    return f"--- a.py\n+++ a.py\n@@ -{start},3 +{start},3 @@\n{body}"


def test_a_mutation_inside_a_switch_branch_is_switch_only(tmp_path: Path) -> None:
    src, bugs = tmp_path / "core.py", tmp_path / "bugs.py"
    src.write_text(SOURCE)
    bugs.write_text(BUGS)
    # Line 3 of decide() is `return "buggy"`, inside the branch; line 2 is the switch's own test.
    inside = _diff(2, '        return "buggy"', '        return "XXbuggyXX"', ("    if SWITCH in bugs:",))
    assert suite.switch_only(src, bugs, "m.core.x_decide__mutmut_3", inside)
    test = _diff(2, "    if SWITCH in bugs:", "    if SWITCH not in bugs:")
    assert not suite.switch_only(src, bugs, "m.core.x_decide__mutmut_1", test)
    after = _diff(4, '    return "right"', '    return "XXrightXX"')
    assert not suite.switch_only(src, bugs, "m.core.x_decide__mutmut_5", after)
    method = _diff(3, "            y = 1", "            y = 2", ("        if OTHER in bugs and self:",))
    assert suite.switch_only(src, bugs, "m.core.xǁFlowǁstep__mutmut_2", method)
    # mutmut numbers a method's lines in its own rendering: the changed line is found by its text.
    renumbered = _diff(9, "            y = 1", "            y = 2")
    assert suite.switch_only(src, bugs, "m.core.xǁFlowǁstep__mutmut_2", renumbered)
    assert suite.switch_only(bugs, bugs, "m.bugs.anything", inside), "the catalog itself"
    assert not suite.switch_only(src, bugs, "m.core.x_missing__mutmut_1", inside)


def test_a_line_written_twice_is_told_apart_by_the_lines_above_it(tmp_path: Path) -> None:
    """`return False` stands under the switch and after it: the diff's context says which one changed."""
    src, bugs = tmp_path / "core.py", tmp_path / "bugs.py"
    src.write_text("from .bugs import SWITCH\n\n\ndef own(x, bugs):\n    if SWITCH in bugs and x == 504:\n"
                   "        return False\n    if x is None:\n        return False\n    return True\n")
    bugs.write_text(BUGS)
    under = _diff(2, "        return False", "        return True", ("    if SWITCH in bugs and x == 504:",))
    assert suite.switch_only(src, bugs, "m.core.x_own__mutmut_5", under)
    after = _diff(4, "        return False", "        return True", ("    if x is None:",))
    assert not suite.switch_only(src, bugs, "m.core.x_own__mutmut_6", after)


def test_the_switch_names_are_the_catalogs_string_constants(tmp_path: Path) -> None:
    bugs = tmp_path / "bugs.py"
    bugs.write_text(BUGS)
    assert suite.switch_names(bugs) == {"SWITCH", "OTHER"}


def test_a_tally_sets_switch_only_and_equivalence_candidates_apart() -> None:
    t = suite.SuiteTally("router")
    t.add("a", suite="fail")
    t.add("b", suite="pass", unit_tests="fail", switch_only="yes")
    t.add("c", suite="pass", unit_tests="pass", switch_only="no")
    t.add("d", suite="pass", unit_tests="fail", switch_only="no")
    n = t.counts()
    assert (n["killed_suite"], n["survived"], n["switch_only"], n["equivalent_candidates"]) == (1, 3, 1, 1)
    assert t.scores() == (0.5, 0.5)


def test_a_switch_only_mutant_set_aside_before_any_run_counts_as_set_aside() -> None:
    t = suite.SuiteTally("router")
    t.add("a", suite="fail")
    t.add("b", suite="pass", unit_tests="fail", switch_only="no", message_only="no")
    t.add("c", suite=suite.NOT_RUN, switch_only="yes")
    n = t.counts()
    assert (n["sampled"], n["switch_only"], n["survived"], n["not_judged"]) == (3, 1, 1, 0)
    assert t.scores() == (0.5, 0.5)  # c is in neither the killed nor the judged
    # A suite that did not run for another reason is not judged, not set aside.
    t.add("d", suite=suite.NOT_RUN)
    assert t.counts()["not_judged"] == 1


def test_dropping_the_switch_set_from_a_call_is_switch_only() -> None:
    assert suite.drops_switch_set(_diff(3, "    if not own_failure(w, e, cfg.bugs):",
                                        "    if not own_failure(w, e, ):"))
    assert suite.drops_switch_set(_diff(3, "    return f(x, bugs=self._bugs)", "    return f(x, )"))
    # Any other change to that line, or dropping another argument, is a mutant like any other.
    assert not suite.drops_switch_set(_diff(3, "    if not own_failure(w, e, cfg.bugs):",
                                            "    if not own_failure(w, None, cfg.bugs):"))
    assert not suite.drops_switch_set(_diff(3, "    if not own_failure(w, e):",
                                            "    if not own_failure(w, ):"))


HELPER = '''from .bugs import SWITCH


def decide(x, bugs):
    if SWITCH in bugs:
        return alone(x)
    return "right"


def alone(x):
    y = x + 1
    return y
'''


def test_a_helper_only_switch_branches_call_is_switch_only(tmp_path: Path) -> None:
    pkg = tmp_path / "reference_router"
    pkg.mkdir()
    src, bugs = pkg / "core.py", pkg / "bugs.py"
    src.write_text(HELPER)
    bugs.write_text(BUGS)
    inside = _diff(2, "    y = x + 1", "    y = x + 2")
    assert suite.switch_only(src, bugs, "m.core.x_alone__mutmut_1", inside)
    # Called from another module too: a run without switches may reach it.
    (pkg / "shell.py").write_text("from .core import alone\n\nprint(alone(1))\n")
    assert not suite.switch_only(src, bugs, "m.core.x_alone__mutmut_1", inside)


MESSAGES = '''def _check_port(value, what):
    if not 1 <= value <= 65535:
        raise ValueError(f"{what} must be an integer in 1..65535, got {value!r}")
    return value


def _pick(key, default):
    return {"url port": 1}.get(key, default)


def spec(body):
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    _check_port(body["port"], "url port")
    _pick("url port", 0)
    return {"n": 1}
'''


def test_a_message_literal_recased_or_wrapped_is_message_wording(tmp_path: Path) -> None:
    src = tmp_path / "workers.py"
    src.write_text(MESSAGES)
    recased = _diff(13, '        raise ValueError("body must be a JSON object")',
                    '        raise ValueError("BODY MUST BE A JSON OBJECT")')
    assert suite.message_only(src, "m.workers.x_spec__mutmut_5", recased)
    # Passed to a parameter that only an exception's message uses.
    passed = _diff(14, '    _check_port(body["port"], "url port")',
                   '    _check_port(body["port"], "XXurl portXX")')
    assert suite.message_only(src, "m.workers.x_spec__mutmut_35", passed)
    # The same literal passed where it is looked up, not shown: behaviour.
    looked_up = _diff(15, '    _pick("url port", 0)', '    _pick("XXurl portXX", 0)')
    assert not suite.message_only(src, "m.workers.x_spec__mutmut_40", looked_up)
    # A key of an answer, not a message.
    key = _diff(16, '    return {"n": 1}', '    return {"N": 1}')
    assert not suite.message_only(src, "m.workers.x_spec__mutmut_41", key)
    # A change that is not only the literal's letters (another literal, or more than one line).
    other = _diff(13, '        raise ValueError("body must be a JSON object")',
                  '        raise ValueError("")')
    assert not suite.message_only(src, "m.workers.x_spec__mutmut_6", other)
    code = _diff(13, '        raise ValueError("body must be a JSON object")',
                 '        raise TypeError("body must be a JSON object")')
    assert not suite.message_only(src, "m.workers.x_spec__mutmut_7", code)


def test_the_score_sets_message_wording_apart() -> None:
    tally = suite.SuiteTally("router")
    tally.add("a", suite="fail")
    tally.add("b", suite="pass", search="pass", unit_tests="fail", switch_only="no", message_only="yes")
    tally.add("c", suite="pass", search="pass", unit_tests="fail", switch_only="no", message_only="no")
    n = tally.counts()
    assert (n["message_only"], n["survived"]) == (1, 2)
    assert tally.scores() == (0.5, 0.5)


def test_suite_coverage_sets_switch_only_lines_apart(tmp_path: Path) -> None:
    cov = load_bench("suite_coverage")
    src, bugs = tmp_path / "core.py", tmp_path / "bugs.py"
    src.write_text(SOURCE)
    bugs.write_text(BUGS)
    # decide(): line 6 (`return "buggy"`) is switch-only; line 7 (`return "right"`) is not.
    assert cov.switch_guarded(src, bugs) == {6, 13, 14}
    assert cov.switch_guarded(bugs, bugs) == {1, 2, 3}, "the catalog itself"
