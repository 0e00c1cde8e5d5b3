"""A test of my own against a live 1p1d cluster: fake engines and the reference router on loopback."""

import pytest


@pytest.mark.pd_cluster(topology="1p1d", connector="mooncake", transport="http")
def test_a_request_goes_through_the_router(pd_cluster):
    status, body = pd_cluster.run(pd_cluster.completion("[pdchaos:me:1] hello", max_tokens=4))
    assert status == 200, body
    assert body["choices"][0]["text"]

    workers = pd_cluster.run(pd_cluster.workers())
    assert sorted((w["role"], w["status"]) for w in workers) == [("decode", "ready"), ("prefill", "ready")]
