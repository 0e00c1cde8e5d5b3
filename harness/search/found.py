"""Write a failure a search found as a normal scenario file: `found/<checker>-<hash>.py` with
`SCENARIOS = [<the shrunk scenario>]`, the original schedule beside it (`ORIGINAL`, not run by default),
the seed, the bug switches (inside the scenario, so `pdchaos run` puts them back) and the replay commands.
A real-time search also writes its bug report beside it (`harness.search.report`)."""

from __future__ import annotations

import hashlib
import shlex
from pathlib import Path
from typing import Any

from harness.search.case import SearchCase
from harness.search.execute import scenario_of
from harness.search.signature import Signature
from harness.search.source import module_head, to_source
from harness.text import clip


def replay_command(path: Path, case: SearchCase, world: str = "sim", router: str = "reference") -> str:
    """The router is named unless it is the reference: a gateway profile brings its own switches and timings,
    which the scenario file does not hold."""
    settings = case.settings if world == "sim" else "scaled"
    words = ["pdchaos", "run", str(path.resolve()), "--world", world, "--settings", settings,
             "--seed", str(case.run_seed)]
    if router not in ("reference", ""):
        words += ["--router", router]
    return shlex.join(words)


def sim_capable(router: str) -> bool:
    """Whether the simulated world runs this router (the reference router or a profile of it)."""
    return router in ("reference", "") or router.startswith("profile:")


def _replay_lines(path: Path, shrunk: SearchCase, real_ok: bool, world: str, router: str,
                  real_note: str) -> list[str]:
    real_line = f"    {replay_command(path, shrunk, 'real', router)}"
    sim_line = f"    {replay_command(path, shrunk, 'sim', router)}"
    if world == "real":
        confirmed = ["Replay (real time, scaled settings: it failed so twice, and the reference router "
                     "passed it):", real_line]
        also = ["Simulated time (not confirmed there):", sim_line] if sim_capable(router) else []
        return confirmed + also
    sim = ["Replay (simulated time, the same verdict):", sim_line]
    real = ["Real time (scaled settings):", real_line]
    return sim + (real if real_ok else [f"Not in real time: {real_note}."])


def _schedule_lines(case: SearchCase) -> list[str]:
    return [f"#   {f.label()}" for f in case.faults]


def _file_name(sig: Signature, body: str) -> str:
    digest = hashlib.sha256(body.encode()).hexdigest()[:10]
    return f"{sig.checker}-{digest}.py"


def render(sig: Signature, seed: int, bugs: tuple[str, ...], original: SearchCase, shrunk: SearchCase,
           reason: str, path_hint: Path | None = None, shifts: tuple[float, ...] = (),
           router: str = "reference", world: str = "sim") -> tuple[str, str]:
    """(file name, source). The name hashes the shrunk scenario, so the same failure found by two seeds is
    one file."""
    names: set[str] = set()
    file_name = _file_name(sig, to_source(scenario_of(shrunk, bugs, "x"), set(), 0))
    # Named after the file, so that found files can be loaded together (scenario names are unique).
    name = f"search_{file_name.removesuffix('.py').replace('-', '_')}"
    shrunk_scenario = scenario_of(shrunk, bugs, name)
    shrunk_src = to_source(shrunk_scenario, names, 0)
    original_src = to_source(scenario_of(original, bugs, name + "_original"), names, 0)
    path = (path_hint or Path("found")) / file_name
    header = [
        f'"""Found by `pdchaos search` (seed {seed}): {sig.checker} fails ({sig.reason}).',
        "",
        f"Router: {router}; bug switches on: {', '.join(bugs) if bugs else 'none'}; searched in "
        f"{'real' if world == 'real' else 'simulated'} time.",
        f"Failure: {reason}",
        f"Shrunk: {len(shrunk.faults)} fault(s) on {shrunk.topology} ({shrunk.connector}/{shrunk.transport}, "
        f"settings {shrunk.settings}, run seed {shrunk.run_seed}); the original: {len(original.faults)} "
        f"fault(s) on {original.topology}.",
        *([f"Robust: it fails the same way with the fault schedule shifted by "
           f"{', '.join(f'{x:g}' for x in shifts)} s."] if shifts else []),
        "",
        *_replay_lines(path, shrunk, "real" in shrunk_scenario.worlds, world, router,
                       shrunk_scenario.world_notes.get("real", "simulation only")),
        *module_head(names),
        "# The shrunk schedule (timeline seconds at scaled settings):",
        *_schedule_lines(shrunk),
        f"SHRUNK = {shrunk_src}",
        "",
        "# The schedule as first found, before shrinking (not run by default):",
        *_schedule_lines(original),
        f"ORIGINAL = {original_src}",
        "",
        "SCENARIOS = [SHRUNK]",
        "",
    ]
    return file_name, "\n".join(header)


def write_found(out_dir: Path, sig: Signature, seed: int, bugs: tuple[str, ...], original: SearchCase,
                shrunk: SearchCase, reason: str, shifts: tuple[float, ...] = (),
                router: str = "reference", world: str = "sim") -> Path:
    folder = out_dir / "found"
    folder.mkdir(parents=True, exist_ok=True)
    name, text = render(sig, seed, bugs, original, shrunk, reason, folder, shifts, router, world)
    path = folder / name
    path.write_text(text)
    return path


def failing_reason(outcome: Any, sig: Signature) -> str:
    for checker, status, reason in outcome.verdicts:
        if checker == sig.checker and status == "fail":
            return clip(reason, 300)
    return sig.reason
