"""The scenario suite as the judge of mutants (`bench/mutation.py --judge suite`).

mutmut 3 makes the mutants (every mutant of a file sits in one trampolined copy under `mutants/`; the
environment variable MUTANT_UNDER_TEST picks the live one). Here the judge is not a unit test: it is what a
gateway team runs, the default suite in simulated time (`pdchaos run --world sim`, at each settings preset:
scaled, as real time runs it, then production), then for the mutants it lets through, a short
`pdchaos search`. A mutant is killed when the suite does not pass (a cell fails or is
unknown: CI goes red either way) or runs past its time limit (a hang is seen too).

The first cell that does not pass ends the suite (its `result.json` is watched as cells finish), so a killed
mutant costs a fraction of a clean run. Mutants are set aside by two stated rules, never by hand, and both
are listed for review and shown apart from the score (three rules):
- equivalence candidates: the suite, the search and the core's own unit tests all let it through;
- message wording: the mutant's one change re-cases a string literal or wraps it in `XX`, and the literal is
  only ever part of an exception's message (it stands in a `raise`, or is passed to a function of its module
  whose parameter is used only in a `raise`). The contract reads an error message for the field it names,
  in any letter case (CONTRACTS §2: the worker API's 4xx); such a change keeps the name in it.
- switch-only code: the mutation sits where only a test-only bug switch leads (the body of an
  `if SWITCH in bugs` branch, or the switch catalog itself). No run without `--inject-bug` executes it: it
  is not the router's behaviour, and the suite runs no switch. Its test, an `if` on a switch, stays in.
  Also a mutant in a function that only switch branches of its module call, and one whose one change drops
  the switch set from a call (`f(x, cfg.bugs)` -> `f(x, )`): the parameter's default is the empty set, which
  is what every run without `--inject-bug` passes. This rule reads the code only, so such a mutant is set
  aside before any run (suite `not_run`): neither the suite nor the search runs a switch, and each would
  spend minutes letting it through.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The suite outcome of a mutant set aside as switch-only before any run.
NOT_RUN = "not_run"
# How long a mutant's suite may run: this many clean runs, plus a floor (a mutant that only slows the
# simulation down is slow, not wrong; one that never ends is a hang).
TIME_LIMIT_FACTOR = 3.0
TIME_LIMIT_FLOOR_S = 30.0
_POLL_S = 0.25


@dataclass(frozen=True)
class JudgeRun:
    outcome: str  # "pass", "fail", "unknown", "timeout", "error"
    wall_s: float
    detail: str = ""


def _env(mutant: str) -> dict[str, str]:
    env = dict(os.environ)
    env["MUTANT_UNDER_TEST"] = mutant
    env.pop("PYTHONPATH", None)  # the copy's own packages come first (the working directory)
    return env


def _first_not_passing(out: Path) -> str | None:
    for path in out.glob("*/result.json"):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        status = result.get("status")
        if status != "pass":
            return f"{status}: {result.get('scenario')} {path.parent.name}: {result.get('reason', '')}"[:300]
    return None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_suite(copy: Path, mutant: str, limit_s: float, extra: Sequence[str] = ()) -> JudgeRun:
    """The default suite in simulated time inside the mutmut copy, with `mutant` live."""
    with tempfile.TemporaryDirectory(prefix="suite-", dir=copy) as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "harness.cli", "run", "--world", "sim", "--no-progress", "--out",
                str(out), *extra]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=copy / "mutants", env=_env(mutant), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while proc.poll() is None:
                bad = _first_not_passing(out)
                if bad is not None:
                    _kill(proc)
                    status = bad.split(":", 1)[0]
                    return JudgeRun(status if status in ("fail", "unknown") else "fail",
                                    time.monotonic() - t0, bad)
                if time.monotonic() - t0 > limit_s:
                    _kill(proc)
                    return JudgeRun("timeout", time.monotonic() - t0, f"past {limit_s:.0f} s")
                time.sleep(_POLL_S)
        finally:
            if proc.poll() is None:
                _kill(proc)
        wall = time.monotonic() - t0
        bad = _first_not_passing(out)
        if proc.returncode == 0 and bad is None:
            return JudgeRun("pass", wall)
        if bad is not None:
            return JudgeRun(bad.split(":", 1)[0], wall, bad)
        return JudgeRun("error" if proc.returncode == 3 else "unknown", wall, f"exit {proc.returncode}")


def run_presets(copy: Path, mutant: str, limit_s: float, presets: Sequence[str]) -> JudgeRun:
    """The default suite at each settings preset in turn (`pdchaos run --settings`), up to the first that
    does not pass; its wall time is all of them."""
    wall = 0.0
    run = JudgeRun("pass", 0.0)
    for preset in presets:
        run = run_suite(copy, mutant, limit_s, ("--settings", preset))
        wall += run.wall_s
        if run.outcome != "pass":
            return JudgeRun(run.outcome, wall, f"{preset}: {run.detail}")
    return JudgeRun(run.outcome, wall, run.detail)


def run_search(copy: Path, mutant: str, budget_s: float, jobs: int) -> JudgeRun:
    """`pdchaos search` with a small budget, stopping at the first failure (exit 1: it found one)."""
    with tempfile.TemporaryDirectory(prefix="search-", dir=copy) as tmp:
        argv = [sys.executable, "-m", "harness.cli", "search", "--budget", str(budget_s), "--shrink-budget",
                "1", "--stop-at-first", "--jobs", str(jobs), "--out", str(Path(tmp) / "search")]
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, cwd=copy / "mutants", env=_env(mutant), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=budget_s * 4 + 120)
        except subprocess.TimeoutExpired:
            return JudgeRun("timeout", time.monotonic() - t0)
        finally:
            # The search's own workers are in its process group: on a timeout, or a SIGTERM or Ctrl-C of
            # the judge, they go with it (subprocess.run would kill the search's main process only).
            _kill(proc)
        wall = time.monotonic() - t0
        outcome = {0: "pass", 1: "fail"}.get(proc.returncode, "unknown")
        tail = out.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return JudgeRun(outcome, wall, tail[0][:300])


def unit_tests_pass(copy: Path, mutant: str, tests: str) -> bool:
    """Whether the core's own unit tests let the mutant through too (the equivalence rule's first half)."""
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", tests]
    done = subprocess.run(argv, cwd=copy / "mutants", env=_env(mutant), capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=900, start_new_session=True)
    return done.returncode == 0


def _removed_lines(diff: str) -> list[str]:
    """The original lines a mutant's diff changes (its `-` lines)."""
    return [line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]


def _removed_with_context(diff: str) -> list[tuple[str, list[str]]]:
    """Each `-` line of a mutant's diff with the original lines just above it in its hunk."""
    out: list[tuple[str, list[str]]] = []
    before: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            before = []
        elif line.startswith("-"):
            out.append((line[1:], list(before)))
            before.append(line[1:])
        elif line.startswith(" "):
            before.append(line[1:])
    return out


def _places(body: list[str], old: str, before: list[str]) -> list[int]:
    """Where in `body` the line `old` stands: by its text, and where that text is there more than once, by
    the lines above it too (mutmut's line numbers are its own)."""
    same = [i for i, line in enumerate(body) if line.strip() == old.strip()]
    context = [c.strip() for c in before if c.strip()][-3:]
    if len(same) < 2:
        return same
    # The most lines above that still fit (the function's own `def` line is renamed in mutmut's diffs).
    for k in range(len(context), 0, -1):
        fitting = [i for i in same if [b.strip() for b in body[:i] if b.strip()][-k:] == context[-k:]]
        if fitting:
            return fitting
    return same


def _function(tree: ast.Module, mutant: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function a mutmut mutant name stands for: `x_func__mutmut_N` or `xǁClassǁmethod__mutmut_N`."""
    leaf = mutant.rsplit(".", 1)[-1].split("__mutmut_")[0]
    parts = leaf.removeprefix("x").strip("ǁ_").split("ǁ") if "ǁ" in leaf else [leaf.removeprefix("x_")]
    body: list[ast.stmt] = tree.body
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        kind = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        found = next((n for n in body if getattr(n, "name", None) == part and isinstance(n, kind)), None)
        if found is None:
            return None
        if last:
            return found  # type: ignore[return-value]
        body = found.body  # type: ignore[union-attr]
    return None


def switch_names(bugs_file: Path) -> set[str]:
    """The switch constants a core's bug catalog defines (UPPER_CASE names bound to strings)."""
    out: set[str] = set()
    for n in ast.parse(bugs_file.read_text()).body:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
            out.update(t.id for t in n.targets if isinstance(t, ast.Name) and t.id.isupper())
    return out


def _names_a_switch(test: ast.expr, switches: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in switches for n in ast.walk(test))


# An argument that passes a switch set: `cfg.bugs`, `self._bugs`, `bugs=bugs`.
_SWITCH_ARG = re.compile(r"(?:\b\w+\s*=\s*)?[\w.]*\b_?bugs\b")


def _added_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def drops_switch_set(diff: str) -> bool:
    """Whether the mutant's one change drops a switch-set argument from a call (see the module doc)."""
    old, new = _removed_lines(diff), _added_lines(diff)
    if len(old) != 1 or len(new) != 1 or not _SWITCH_ARG.search(old[0]):
        return False

    def squeeze(line: str) -> str:
        return re.sub(r",\)", ")", re.sub(r"\s+", "", line))

    return squeeze(_SWITCH_ARG.sub("", old[0])) == squeeze(new[0])


def switch_only(source: Path, bugs_file: Path, mutant: str, diff: str) -> bool:
    """Whether every line the mutant changes lies where only a bug switch leads, or the change only drops
    the switch set from a call (see the module doc)."""
    if source.resolve() == bugs_file.resolve() or drops_switch_set(diff):
        return True
    found = _changed_in(source, mutant, diff)
    if found is None:
        return False
    tree, func, lines = found
    if not lines:
        return False
    switches = switch_names(bugs_file)
    if _called_only_under_a_switch(tree, func.name, switches) and not _called_elsewhere(source, func.name):
        return True
    guarded = guarded_lines(func, switches)
    return lines <= guarded


def _changed_in(
    source: Path, mutant: str, diff: str
) -> tuple[ast.Module, ast.FunctionDef | ast.AsyncFunctionDef, set[int]] | None:
    """The source's tree, the mutant's function in it and the file lines the diff changes there (None: no
    such function)."""
    text = source.read_text()
    tree = ast.parse(text)
    func = _function(tree, mutant)
    return None if func is None else (tree, func, _changed_lines(text, func, diff))


def _changed_lines(text: str, func: ast.FunctionDef | ast.AsyncFunctionDef, diff: str) -> set[int]:
    """The file's line numbers of the lines the diff changes in `func`. mutmut numbers a method's lines in
    its own rendering of the function (not always the file's): each is found by its text instead."""
    body = text.splitlines()[func.lineno - 1:func.end_lineno]
    changed = _removed_with_context(diff)
    return {func.lineno + i for old, before in changed for i in _places(body, old, before)}


def _one_literal_changed(diff: str) -> tuple[str, str] | None:
    """(old, new) when the diff changes one line in one string literal only (else None)."""
    old, new = _removed_lines(diff), _added_lines(diff)
    if len(old) != 1 or len(new) != 1:
        return None
    a, b = _literals(old[0]), _literals(new[0])
    if a is None or b is None or len(a) != len(b) or a[0] != b[0]:
        return None
    changed = [(x, y) for x, y in zip(a[1], b[1], strict=True) if x != y]
    return changed[0] if len(changed) == 1 else None


def _literals(line: str) -> tuple[str, list[str]] | None:
    """The line with its string literals blanked out, and their values (None: not one parsable line)."""
    try:
        tree = ast.parse(line.strip().removesuffix(":") or "pass")
    except SyntaxError:
        return None
    values = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            n.value = ""
    return ast.dump(tree), values


def _in_raise(func: ast.AST, node: ast.AST) -> bool:
    return any(isinstance(r, ast.Raise) and any(n is node for n in ast.walk(r)) for r in ast.walk(func))


def _param_only_raised(tree: ast.Module, call: ast.Call, node: ast.AST) -> bool:
    """Whether `node`, an argument of `call` to a function of this module, lands in a parameter used only in
    that function's `raise` statements."""
    name = getattr(call.func, "id", None)
    target = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if target is None:
        return False
    params = [a.arg for a in target.args.args]
    index = next((i for i, a in enumerate(call.args) if a is node), None)
    if index is not None:
        param = params[index] if index < len(params) else None
    else:
        param = next((k.arg for k in call.keywords if k.value is node), None)
    uses = [n for n in ast.walk(target) if isinstance(n, ast.Name) and n.id == param]
    return bool(uses) and all(_in_raise(target, u) for u in uses)


def message_only(source: Path, mutant: str, diff: str) -> bool:
    """Whether the mutant only re-cases or `XX`-wraps a literal of an exception's message (see the module
    doc)."""
    change = _one_literal_changed(diff)
    if change is None or change[0].lower() not in change[1].lower():
        return False
    found = _changed_in(source, mutant, diff)
    if found is None:
        return False
    tree, func, lines = found
    places = [n for n in ast.walk(func)
              if isinstance(n, ast.Constant) and n.value == change[0] and n.lineno in lines]
    if not places:
        return False
    calls = [c for c in ast.walk(func) if isinstance(c, ast.Call)]
    for node in places:
        if _in_raise(func, node):
            continue
        call = next((c for c in calls if any(a is node for a in (*c.args, *(k.value for k in c.keywords)))),
                    None)
        if call is None or not _param_only_raised(tree, call, node):
            return False
    return True


def guarded_lines(node: ast.AST, switches: set[str]) -> set[int]:
    """The lines inside `node` that only an `if` on a switch leads to."""
    guarded: set[int] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.If) and _names_a_switch(sub.test, switches):
            for stmt in sub.body:
                guarded.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return guarded


# The packages whose code may call a core's functions (the shells, the simulated world).
_CALLERS = ("reference_router", "fake_engines", "harness")


def _called_elsewhere(source: Path, name: str) -> bool:
    """Whether another module of the checkout calls `name` (then its own module's calls are not all)."""
    root = next((p for p in source.resolve().parents if (p / _CALLERS[0]).is_dir()), None)
    if root is None:
        return True
    call = re.compile(rf"\b{re.escape(name)}\(")
    others = (f for pkg in _CALLERS for f in (root / pkg).rglob("*.py") if f.resolve() != source.resolve())
    return any(call.search(f.read_text(errors="replace")) for f in others)


def _called_only_under_a_switch(tree: ast.Module, name: str, switches: set[str]) -> bool:
    """Whether every call of function `name` in its module (by name or as an attribute) is where only a
    switch leads: a helper no run without `--inject-bug` calls."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]
    if not calls:
        return False
    guarded = guarded_lines(tree, switches)
    return all(c.lineno in guarded for c in calls)


@dataclass
class SuiteTally:
    core: str
    results: dict[str, dict[str, str]] = field(default_factory=dict)

    def add(self, mutant: str, **facts: str) -> None:
        self.results.setdefault(mutant, {}).update(facts)

    def counts(self) -> Counter[str]:
        n: Counter[str] = Counter()
        for facts in self.results.values():
            n["sampled"] += 1
            suite = facts.get("suite", "")
            if suite == NOT_RUN and facts.get("switch_only") == "yes":
                n["switch_only"] += 1
                continue
            if suite in ("fail", "unknown", "timeout"):
                n[f"suite_{suite}"] += 1
                n["killed_suite"] += 1
            elif facts.get("search") == "fail":
                n["killed_search"] += 1
            elif suite == "pass":
                n["survived"] += 1
                if facts.get("switch_only") == "yes":
                    n["switch_only"] += 1
                elif facts.get("message_only") == "yes":
                    n["message_only"] += 1
                elif facts.get("unit_tests") == "pass":
                    n["equivalent_candidates"] += 1
            else:
                n["not_judged"] += 1
        return n

    def scores(self) -> tuple[float | None, float | None]:
        """(suite, suite + search): killed over the sampled mutants that are not equivalence candidates."""
        n = self.counts()
        judged = (n["sampled"] - n["equivalent_candidates"] - n["switch_only"] - n["message_only"]
                  - n["not_judged"])
        if judged <= 0:
            return None, None
        return n["killed_suite"] / judged, (n["killed_suite"] + n["killed_search"]) / judged


_MUTANT_NAME = re.compile(r"__mutmut_(?:\d+|orig)\b")


def diff_key(diff: str) -> str:
    """What a mutant changes, as a short hash of its diff's changed lines with mutmut's names taken out (an
    edit of the lines around it keeps the key). mutmut numbers a function's mutants in order: after a
    change to the function, a name may stand for another mutation, and its key tells."""
    changed = "\n".join(f"-{line}" for line in _removed_lines(diff)) + "\n" + "\n".join(
        f"+{line}" for line in _added_lines(diff))
    return hashlib.sha256(_MUTANT_NAME.sub("__mutmut", changed).encode()).hexdigest()[:12]


def renumbered(recorded: Mapping[str, Mapping[str, str]], keys: Mapping[str, str]) -> list[str]:
    """The recorded mutants whose name now stands for another mutation (their diff key differs). A record
    without a key (an older file) cannot tell, and is taken as it is."""
    return sorted(n for n, facts in recorded.items()
                  if facts.get("diff_key") and n in keys and keys[n] != facts["diff_key"])


def seeded_sample(names: Iterable[tuple[str, str]], seed: int, n: int) -> list[tuple[str, str]]:
    """The `n` (path, mutant) pairs that rank first by a hash of the seed and the mutant's name. A mutant's
    rank does not depend on the others, so a change to the code adds or drops only its own mutants: a
    sample judged over several sittings (`--resume`) stays one sample."""
    def rank(item: tuple[str, str]) -> bytes:
        return hashlib.sha256(f"{seed}:{item[1]}".encode()).digest()
    return sorted(names, key=rank)[:n]


def resumed(results_file: Path, core: str, seed: int, presets: Sequence[str],
            sample: Sequence[tuple[str, str]],
            keys: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """What a `--results` file already judged of this core's `sample` (to be kept, not run again). The file
    must be of the same seed and presets; recorded mutants outside the sample (the code changed) are left
    out and named, and so are those whose name now stands for another mutation (`keys`: each sampled
    mutant's `diff_key` now): those are judged again."""
    try:
        report = json.loads(results_file.read_text())
        recorded = report.get("cores", {}).get(core, {}).get("mutants", {})
        theirs = (report["seed"], list(report["presets"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"--resume {results_file}: not a --results file ({exc})") from exc
    if theirs != (seed, list(presets)):
        raise SystemExit(f"--resume {results_file}: judged with seed {theirs[0]} and presets "
                         f"{','.join(theirs[1])}, not seed {seed} and presets {','.join(presets)}")
    wanted = {name for _, name in sample}
    stale = set(renumbered(recorded, keys or {}))
    kept = {name: dict(facts) for name, facts in recorded.items()
            if name in wanted and "suite" in facts and name not in stale}
    gone = sorted(set(recorded) - wanted)
    print(f"{core}: resuming {results_file}: {len(kept)} of the {len(sample)} sampled already judged"
          + (f"; left out, no longer sampled: {', '.join(gone)}" if gone else "")
          + (f"; judged again, now another mutation: {', '.join(sorted(stale))}" if stale else ""),
          flush=True)
    return kept


def print_tally(tally: SuiteTally, wall_s: float) -> None:
    n = tally.counts()
    suite, both = tally.scores()
    print(f"core {tally.core}: {n['sampled']} mutants sampled; suite killed {n['killed_suite']} "
          f"(fail {n['suite_fail']}, unknown {n['suite_unknown']}, timeout {n['suite_timeout']}); "
          f"search killed {n['killed_search']} more; survived {n['survived']} "
          f"({n['equivalent_candidates']} also pass the unit tests: equivalence candidates, set aside; "
          f"{n['switch_only']} in switch-only code, {n['message_only']} message wording: set aside); "
          f"not judged {n['not_judged']}", flush=True)
    print(f"core {tally.core}: score suite {_percent(suite)}, suite + search {_percent(both)}; "
          f"wall {wall_s / 60:.1f} min", flush=True)


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
