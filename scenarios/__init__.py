"""Scenario scripts (declarative): each file defines `SCENARIOS = [Scenario(...), ...]`.

A scenario is data (`harness.scenario`): the topologies, connectors and transports it applies to, the router
and engine settings, the client workload, a fault timeline of `Step(name, action, when)` and the checkers that
judge the run (`Expect(name, params)`, see `harness.checkers`). Example:

    from harness.scenario import At, Expect, Restart, Scenario, Step

    SCENARIOS = [
        Scenario(
            name="my_restart",
            description="prefill restarts; the router must pick up its new engine id",
            bugs=("#2491",),
            topologies=("1p1d", "2p1d"),
            timeline=(Step("restart", Restart("prefill-0", down_s=0.5), At(1.0)),),
            expect=(Expect("handoff"), Expect("transfer_timeout")),
            catches=("stale_engine_id",),
        ),
    ]

Run: `pdchaos run my_restart` (or a file path); `pdchaos list` shows what is here. Files starting with `_`
hold shared settings and are not scenario files.
"""
