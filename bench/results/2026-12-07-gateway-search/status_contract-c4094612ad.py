"""Found by `pdchaos search` (seed 3): status_contract fails (# action the status contract does not allow).

Router: smg==1.13.0; bug switches on: none; searched in real time.
Failure: 2 action(s) the status contract does not allow
Shrunk: 1 fault(s) on 1p1d (mooncake/http, settings scaled, run seed 0); the original: 2 fault(s) on 1p6d.

Replay (real time, scaled settings: it failed so twice, and the reference router passed it):
    pdchaos run /tmp/gsearch_smg3/found/status_contract-c4094612ad.py --world real --settings scaled --seed 0 --router smg==1.13.0
"""

from __future__ import annotations

from harness.scenario import AddWorker, At, EngineSettings, Expect, RouterSettings, Scenario, Step, Workload

# The shrunk schedule (timeline seconds at scaled settings):
#   api_mistake@prefill-0[2.2+0]
SHRUNK = Scenario(
    name='search_status_contract_c4094612ad',
    description='pdchaos search case: 1 fault(s) on 1p1d',
    transports=('http',),
    router=RouterSettings(health_timeout_s=0.5, request_timeout_s=2.0),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        concurrency=1,
        duration_s=9.2,
        stream_fraction=0.0,
        chat_fraction=0.0,
        prompt_words=(2, 8),
        max_tokens=1,
        stop_fraction=0.3,
    ),
    timeline=(
        Step(
            name='f0_api_mistake',
            action=AddWorker(
                target='prefill-0',
                mistake={
                    'url': '{url}/',
                },
                refused='url',
            ),
            when=At(t=2.2),
        ),
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
        Expect(checker='transfer_timeout'),
        Expect(
            checker='recovery',
            params={
                'max_recovery_s': 6.0,
                'faults': ['f0_api_mistake'],
                'require_ready': False,
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 6.0,
                'faults': ['f0_api_mistake'],
            },
        ),
        Expect(checker='worker_api'),
    ),
    tags=('search',),
)

# The schedule as first found, before shrinking (not run by default):
#   api_mistake@decode-1[2.2+0]
#   api_mistake@decode-1[3.1+0]
ORIGINAL = Scenario(
    name='search_status_contract_c4094612ad_original',
    description='pdchaos search case: 2 fault(s) on 1p6d',
    topologies=('1p6d',),
    connectors=('nixl',),
    transports=('http',),
    router=RouterSettings(
        health_timeout_s=0.5,
        identity_check_interval_s=30.0,
        request_timeout_s=2.0,
        circuit_breaker_failures=2,
        circuit_breaker_open_s=2.0,
    ),
    engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=0.3),
    workload=Workload(
        concurrency=2,
        duration_s=11.4,
        stream_fraction=0.0,
        prompt_words=(40, 200),
        max_tokens=16,
        mistake_fraction=0.1,
        eos_fraction=0.2,
    ),
    timeline=(
        Step(
            name='f0_api_mistake',
            action=AddWorker(
                target='decode-1',
                mistake={
                    'url': '{url}/',
                },
                refused='url',
            ),
            when=At(t=2.2),
        ),
        Step(
            name='f1_api_mistake',
            action=AddWorker(
                target='decode-1',
                mistake={
                    'url': '{url}/',
                },
                refused='url',
            ),
            when=At(t=3.1),
        ),
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
                'grace_s': 7.0,
            },
        ),
        Expect(
            checker='no_local_compute',
            params={
                'grace_s': 7.0,
                'excuse_kinds': ['restart', 'slow_start', 'crash', 'die', 'graceful_stop', 'respawn'],
            },
        ),
        Expect(checker='transfer_timeout'),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 7.0,
                'faults': ['f1_api_mistake'],
            },
        ),
        Expect(checker='worker_api'),
    ),
    tags=('search',),
)

SCENARIOS = [SHRUNK]
