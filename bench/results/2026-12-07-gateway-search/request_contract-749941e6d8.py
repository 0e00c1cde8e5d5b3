"""Found by `pdchaos search` (seed 0): request_contract fails (# request not handled as the request contract says).

Router: smg==1.13.0; bug switches on: none; searched in real time.
Failure: 2 request(s) not handled as the request contract says
Shrunk: 1 fault(s) on 1p1d (mooncake/http, settings scaled, run seed 0); the original: 1 fault(s) on 1p1d.

Replay (real time, scaled settings: it failed so twice, and the reference router passed it):
    pdchaos run /tmp/gsearch_smg3/found/request_contract-749941e6d8.py --world real --settings scaled --seed 0 --router smg==1.13.0
"""

from __future__ import annotations

from harness.scenario import At, EngineSettings, Expect, Restart, RouterSettings, Scenario, Step, Workload

# The shrunk schedule (timeline seconds at scaled settings):
#   restart@prefill-0[0.5+0]
SHRUNK = Scenario(
    name='search_request_contract_749941e6d8',
    description='pdchaos search case: 1 fault(s) on 1p1d',
    transports=('http',),
    router=RouterSettings(health_timeout_s=0.5, request_timeout_s=2.0),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        concurrency=1,
        duration_s=7.52,
        stream_fraction=0.0,
        chat_fraction=0.0,
        prompt_words=(2, 8),
        max_tokens=1,
    ),
    timeline=(
        Step(name='f0_restart', action=Restart(target='prefill-0'), when=At(t=0.5)),
    ),
    expect=(
        Expect(checker='nothing_lost'),
        Expect(checker='output'),
        Expect(checker='legs_sequenced'),
        Expect(checker='legs_once'),
        Expect(checker='status_contract'),
        Expect(checker='breaker_contract'),
        Expect(checker='leg_shape'),
        Expect(checker='handoff_params'),
        Expect(checker='request_contract'),
        Expect(checker='router_events'),
        Expect(checker='error_answers'),
        Expect(checker='call_deadlines'),
        Expect(checker='probe_slots'),
        Expect(checker='router_metrics'),
        Expect(
            checker='handoff',
            params={
                'grace_s': 6.0,
            },
        ),
        Expect(
            checker='no_local_compute',
            params={
                'grace_s': 6.0,
                'excuse_kinds': ['restart', 'slow_start', 'crash', 'die', 'graceful_stop', 'respawn'],
            },
        ),
        Expect(
            checker='recovery',
            params={
                'max_recovery_s': 6.0,
                'faults': ['f0_restart'],
                'require_ready': False,
            },
        ),
        Expect(
            checker='reported_engine_id',
            params={
                'max_lag_s': 6.0,
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 6.0,
                'faults': ['f0_restart'],
            },
        ),
    ),
    tags=('search',),
)

# The schedule as first found, before shrinking (not run by default):
#   restart@prefill-0[0.5+0]
ORIGINAL = Scenario(
    name='search_request_contract_749941e6d8_original',
    description='pdchaos search case: 1 fault(s) on 1p1d',
    transports=('http',),
    router=RouterSettings(health_timeout_s=0.5, request_timeout_s=2.0),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        concurrency=1,
        duration_s=7.52,
        stream_fraction=0.0,
        chat_fraction=0.0,
        prompt_words=(2, 8),
        max_tokens=1,
    ),
    timeline=(
        Step(name='f0_restart', action=Restart(target='prefill-0'), when=At(t=0.5)),
    ),
    expect=(
        Expect(checker='nothing_lost'),
        Expect(checker='output'),
        Expect(checker='legs_sequenced'),
        Expect(checker='legs_once'),
        Expect(checker='status_contract'),
        Expect(checker='breaker_contract'),
        Expect(checker='leg_shape'),
        Expect(checker='handoff_params'),
        Expect(checker='request_contract'),
        Expect(checker='router_events'),
        Expect(checker='error_answers'),
        Expect(checker='call_deadlines'),
        Expect(checker='probe_slots'),
        Expect(checker='router_metrics'),
        Expect(
            checker='handoff',
            params={
                'grace_s': 6.0,
            },
        ),
        Expect(
            checker='no_local_compute',
            params={
                'grace_s': 6.0,
                'excuse_kinds': ['restart', 'slow_start', 'crash', 'die', 'graceful_stop', 'respawn'],
            },
        ),
        Expect(
            checker='recovery',
            params={
                'max_recovery_s': 6.0,
                'faults': ['f0_restart'],
                'require_ready': False,
            },
        ),
        Expect(
            checker='reported_engine_id',
            params={
                'max_lag_s': 6.0,
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 6.0,
                'faults': ['f0_restart'],
            },
        ),
    ),
    tags=('search',),
)

SCENARIOS = [SHRUNK]
