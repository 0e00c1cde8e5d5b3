"""Found by `pdchaos search` (seed 6): probe_schedule fails (probe schedule broken: # gap too long).

Router: vllm-router==0.1.17; bug switches on: none; searched in real time.
Failure: probe schedule broken: 2 gap(s) too long
Shrunk: 1 fault(s) on 1p1d (mooncake/http, settings scaled, run seed 1); the original: 2 fault(s) on 2p1d.

Replay (real time, scaled settings: it failed so twice, and the reference router passed it):
    pdchaos run /tmp/gsearch_vr/found/probe_schedule-b43c5f6c2c.py --world real --settings scaled --seed 1 --router vllm-router==0.1.17
"""

from __future__ import annotations

from harness.scenario import At, EngineSettings, Expect, Heal, HealLink, LinkBandwidth, RouterSettings, Scenario, Step, Wedge, Workload

# The shrunk schedule (timeline seconds at scaled settings):
#   freeze@decode-0[1.8+4.7]
SHRUNK = Scenario(
    name='search_probe_schedule_b43c5f6c2c',
    description='pdchaos search case: 1 fault(s) on 1p1d',
    transports=('http',),
    router=RouterSettings(
        health_timeout_s=0.5,
        failure_threshold=3,
        success_threshold=2,
        request_timeout_s=2.0,
    ),
    engines=EngineSettings(transfer_timeout_s=1.0, kv_abort_timeout_s=0.3),
    workload=Workload(concurrency=1, duration_s=14.5, stream_fraction=0.0, chat_fraction=0.0, max_tokens=1),
    timeline=(
        Step(name='f0_freeze', action=Wedge(target='decode-0', mode='sigstop'), when=At(t=1.8)),
        Step(name='f0_freeze_heal', action=Heal(target='decode-0'), when=At(t=6.5)),
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
                'faults': ['f0_freeze'],
                'require_ready': False,
            },
        ),
        Expect(
            checker='probe_schedule',
            params={
                'kinds': ['wedge'],
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 7.0,
                'faults': ['f0_freeze'],
            },
        ),
    ),
    tags=('search',),
)

# The schedule as first found, before shrinking (not run by default):
#   freeze@prefill-1[1.8+4.7]
#   link_bandwidth@prefill-1.side_channel[6.6+0.5]
ORIGINAL = Scenario(
    name='search_probe_schedule_b43c5f6c2c_original',
    description='pdchaos search case: 2 fault(s) on 2p1d',
    topologies=('2p1d',),
    connectors=('nixl',),
    transports=('http',),
    router=RouterSettings(
        health_timeout_s=0.5,
        request_timeout_s=2.0,
        circuit_breaker_failures=4,
        circuit_breaker_open_s=1.0,
    ),
    engines=EngineSettings(transfer_timeout_s=1.0),
    workload=Workload(
        mode='open',
        concurrency=6,
        duration_s=17.0,
        stream_fraction=1.0,
        prompt_words=(40, 200),
        max_tokens=2,
        eos_fraction=0.2,
    ),
    timeline=(
        Step(name='f0_freeze', action=Wedge(target='prefill-1', mode='sigstop'), when=At(t=1.8)),
        Step(name='f0_freeze_heal', action=Heal(target='prefill-1'), when=At(t=6.5)),
        Step(name='f1_link_bandwidth', action=LinkBandwidth(target='prefill-1'), when=At(t=6.6)),
        Step(
            name='f1_link_bandwidth_heal',
            action=HealLink(target='prefill-1', link='side_channel'),
            when=At(t=7.1),
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
            checker='probe_schedule',
            params={
                'kinds': ['wedge'],
            },
        ),
        Expect(
            checker='availability',
            params={
                'before': None,
                'during': None,
                'after': 0.95,
                'settle_s': 7.0,
                'faults': ['f1_link_bandwidth'],
            },
        ),
    ),
    tags=('search',),
)

SCENARIOS = [SHRUNK]
