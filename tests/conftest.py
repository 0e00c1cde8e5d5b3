"""Shared test configuration: `pytester` drives the pdchaos pytest plugin in the plugin tests."""

pytest_plugins = ["pytester"]
