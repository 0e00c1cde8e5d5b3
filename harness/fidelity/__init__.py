"""Fake-engine fidelity: the same probes against a fake and a real engine pair (`pdchaos fidelity`)."""
