"""Any router, from a command template: `cmd:my-router --port {port} {prefill_args} {decode_args}`.

The template is split like a shell line, then each word is formatted with the placeholders in
`PLACEHOLDERS`. A word that is exactly `{prefill_args}`, `{decode_args}`, `{prefills}` or `{decodes}` expands
to several words. Such routers are read through the same worker API (`GET /workers`) when they have one;
otherwise the harness judges from the engines' side and the status-based checks come out `unknown`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import string

from harness.routers.base import RUN_API_KEY, RouterAdapter, RouterAdapterError, RouterLaunch, fmt_seconds
from harness.scenario import RouterSettings
from harness.topology import Topology

PLACEHOLDERS = (
    "port", "host", "url", "prefills", "decodes", "prefill_args", "decode_args", "connector", "transport",
    "health_interval", "health_timeout", "failure_threshold", "success_threshold", "request_timeout",
    "events_file", "api_key", "prefill_policy", "decode_policy",
)
_LIST_PLACEHOLDERS = ("{prefills}", "{decodes}", "{prefill_args}", "{decode_args}")


class CommandRouter(RouterAdapter):
    """Any router, from a command template (`cmd:smg --port {port} {prefill_args} ...`)."""

    name = "cmd"
    has_events = False

    def __init__(self, template: str, api_key: str | None = None, name: str = "cmd") -> None:
        super().__init__(api_key)
        if not template.strip():
            raise RouterAdapterError("empty router command template")
        try:
            words = shlex.split(template)
        except ValueError as e:  # an unbalanced quote: say so instead of a traceback
            raise RouterAdapterError(f"router command template {template!r}: {e}") from None
        if not words:
            raise RouterAdapterError("empty router command template")
        for w in words:
            problem = _placeholder_problem(w)
            if problem is not None:
                raise RouterAdapterError(f"router template word {w!r}: {problem}")
        self.template = template
        self.words = words
        self.name = name
        if self.api_key is None and any("{api_key}" in w for w in words):
            # The template passes a key: the harness gives it one and sends it on the worker API.
            self.api_key = RUN_API_KEY

    def cli_spec(self) -> str | None:
        return "cmd:" + self.template

    def executable_problem(self) -> str | None:
        """Why the template's program cannot be started from here (not on PATH, not executable), or None."""
        exe = self.words[0]
        if shutil.which(exe) or (os.sep in exe and os.access(exe, os.X_OK)):
            return None
        return f"router command {exe!r} not found or not executable"

    def values(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> tuple[dict[str, str], dict[str, list[str]]]:
        prefills = [p for p in topo.prefills if p.name in registered]
        decodes = [d for d in topo.decodes if d.name in registered]
        prefill_args: list[str] = []
        for p in prefills:
            prefill_args += ["--prefill", p.url(topo.transport)]
            if topo.connector == "mooncake":
                prefill_args.append(str(p.bootstrap_port))
        decode_args: list[str] = []
        for d in decodes:
            decode_args += ["--decode", d.url(topo.transport)]
        scalars = {
            "port": str(topo.router_port),
            "host": "127.0.0.1",
            "url": topo.router_url,
            "connector": topo.connector,
            "transport": topo.transport,
            "health_interval": fmt_seconds(settings.health_interval_s),
            "health_timeout": fmt_seconds(settings.health_timeout_s),
            "failure_threshold": str(settings.failure_threshold),
            "success_threshold": str(settings.success_threshold),
            "request_timeout": fmt_seconds(settings.request_timeout_s),
            "events_file": events_file,
            "api_key": self.api_key or "",
            "prefill_policy": settings.prefill_policy,
            "decode_policy": settings.decode_policy,
            "prefills": " ".join(p.url(topo.transport) for p in prefills),
            "decodes": " ".join(d.url(topo.transport) for d in decodes),
            "prefill_args": " ".join(prefill_args),
            "decode_args": " ".join(decode_args),
        }
        lists = {
            "{prefills}": [p.url(topo.transport) for p in prefills],
            "{decodes}": [d.url(topo.transport) for d in decodes],
            "{prefill_args}": prefill_args,
            "{decode_args}": decode_args,
        }
        return scalars, lists

    def launch(
        self, topo: Topology, settings: RouterSettings, registered: list[str], events_file: str
    ) -> RouterLaunch:
        scalars, lists = self.values(topo, settings, registered, events_file)
        argv: list[str] = []
        for w in self.words:
            if w in _LIST_PLACEHOLDERS:
                argv += lists[w]
            else:
                argv.append(w.format(**scalars))
        return RouterLaunch(argv=argv, ready_prefix=None)


def _placeholder_problem(word: str) -> str | None:
    """What is wrong with a template word's placeholders: each is one of PLACEHOLDERS, bare (no attribute,
    index, conversion or format: `{port.real}` would reach into the value)."""
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(word)
                  if name is not None]
    except ValueError as e:
        return f"{e} (a literal brace is written {{{{ or }}}})"
    for name, spec, conv in fields:
        shown = name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
        if name not in PLACEHOLDERS:
            return f"unknown placeholder {{{shown}}} (known: {', '.join(PLACEHOLDERS)})"
        if spec or conv:
            return f"placeholder {{{shown}}}: write it bare, {{{name}}}"
    return None
