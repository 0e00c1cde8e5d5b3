"""Found by `pdchaos search` (seed 10): breaker_contract fails (# action the circuit breaker contract does not allow).

Router: vllm-router==0.1.17; bug switches on: none; searched in real time.
Failure: 5 action(s) the circuit breaker contract does not allow
Shrunk: 2 fault(s) on 3p1d (mooncake/http, settings scaled, run seed 406); the original: 3 fault(s) on 3p2d.

Replay (real time, scaled settings: it failed so twice, and the reference router passed it):
    pdchaos run /tmp/gsearch_vr/found/breaker_contract-1e7ea02906.py --world real --settings scaled --seed 406 --router vllm-router==0.1.17
"""

from __future__ import annotations

from harness.scenario import At, EngineFault, EngineSettings, Expect, Heal, HealLink, Partition, Restart, RouterSettings, Scenario, Step, Workload

# The shrunk schedule (timeline seconds at scaled settings):
#   fail_requests@prefill-1[1.5+1.8]
#   restart@prefill-0[4.9+0]
SHRUNK = Scenario(
    name='search_breaker_contract_1e7ea02906',
    description='pdchaos search case: 2 fault(s) on 3p1d',
    topologies=('3p1d',),
    transports=('http',),
    router=RouterSettings(
        health_timeout_s=0.5,
        request_timeout_s=2.0,
        circuit_breaker_failures=3,
        circuit_breaker_open_s=1.0,
    ),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        mode='open',
        concurrency=3,
        duration_s=13.22,
        stream_fraction=1.0,
        chat_fraction=0.0,
        prompt_words=(2, 8),
        max_tokens=5,
        completion_tokens_fraction=0.5,
        stop_fraction=0.3,
    ),
    timeline=(
        Step(
            name='f0_fail_requests',
            action=EngineFault(
                target='prefill-1',
                kind='fail_requests',
                params={
                    'count': 10,
                    'status': 503,
                },
            ),
            when=At(t=1.5),
        ),
        Step(
            name='f0_fail_requests_heal',
            action=Heal(target='prefill-1', kind='fail_requests'),
            when=At(t=3.3),
        ),
        Step(name='f1_restart', action=Restart(target='prefill-0'), when=At(t=4.9)),
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
        Expect(
            checker='recovery',
            params={
                'max_recovery_s': 7.0,
                'faults': ['f1_restart'],
                'require_ready': False,
            },
        ),
        Expect(
            checker='reported_engine_id',
            params={
                'max_lag_s': 7.0,
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 7.0,
                'faults': ['f1_restart'],
            },
        ),
    ),
    tags=('search',),
)

# The schedule as first found, before shrinking (not run by default):
#   fail_requests@prefill-1[1.5+1.8]
#   partition_timeout@prefill-0.bootstrap[1.7+1.9]
#   partition_timeout@decode-1.serve[2+1.3]
ORIGINAL = Scenario(
    name='search_breaker_contract_1e7ea02906_original',
    description='pdchaos search case: 3 fault(s) on 3p2d',
    topologies=('3p2d',),
    transports=('http',),
    router=RouterSettings(
        health_timeout_s=0.5,
        request_timeout_s=2.0,
        circuit_breaker_failures=3,
        circuit_breaker_open_s=1.0,
    ),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        mode='open',
        concurrency=3,
        duration_s=11.9,
        stream_fraction=1.0,
        chat_fraction=0.0,
        prompt_words=(2, 8),
        max_tokens=5,
        completion_tokens_fraction=0.5,
        stop_fraction=0.3,
    ),
    timeline=(
        Step(
            name='f0_fail_requests',
            action=EngineFault(
                target='prefill-1',
                kind='fail_requests',
                params={
                    'count': 10,
                    'status': 503,
                },
            ),
            when=At(t=1.5),
        ),
        Step(
            name='f1_partition_timeout',
            action=Partition(target='prefill-0', link='bootstrap', mode='timeout'),
            when=At(t=1.7),
        ),
        Step(
            name='f2_partition_timeout',
            action=Partition(target='decode-1', mode='timeout'),
            when=At(t=2.0),
        ),
        Step(
            name='f0_fail_requests_heal',
            action=Heal(target='prefill-1', kind='fail_requests'),
            when=At(t=3.3),
        ),
        Step(
            name='f2_partition_timeout_heal',
            action=HealLink(target='decode-1', link='serve'),
            when=At(t=3.3),
        ),
        Step(
            name='f1_partition_timeout_heal',
            action=HealLink(target='prefill-0', link='bootstrap'),
            when=At(t=3.6),
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
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 7.0,
                'faults': ['f1_partition_timeout'],
            },
        ),
    ),
    tags=('search',),
)

SCENARIOS = [SHRUNK]
