"""The control operations: registry decisions applied to live proxies (asyncio shell).

Every operation runs on the proxy's event loop and only waits for a bind; it never waits on a
connection's data, so the control API stays responsive whatever the toxics are doing.
"""

from __future__ import annotations

from harness.toxiproxy.proxy import ProxyRuntime
from harness.toxiproxy.registry import ProxyRegistry, ProxySpec
from harness.toxiproxy.toxics import ToxicSpec


class ToxiproxyService:
    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.registry = ProxyRegistry()
        self.runtimes: dict[str, ProxyRuntime] = {}

    def proxies(self) -> dict[str, ProxySpec]:
        return dict(self.registry.proxies)

    def get(self, name: str) -> ProxySpec:
        return self.registry.get(name)

    async def create(self, body: object) -> ProxySpec:
        return await self._install(self.registry.check_new(body))

    async def _install(self, spec: ProxySpec) -> ProxySpec:
        runtime = ProxyRuntime(spec, self.seed)
        if spec.enabled:
            await runtime.start()
        try:
            self.registry.add(spec)  # checked again: another request may have won the name meanwhile
        except Exception:
            runtime.stop()
            raise
        self.runtimes[spec.name] = runtime
        return spec

    async def update(self, name: str, body: object) -> ProxySpec:
        plan = self.registry.plan_update(name, body)
        spec = self.registry.get(name)
        runtime = self.runtimes[name]
        moved = plan.listen != spec.listen
        # Every bind comes before any change, so a refused one (409) leaves the proxy as it was.
        if plan.enabled and moved:
            await runtime.move(plan.listen)
        elif plan.enabled:
            await runtime.start()
        else:
            runtime.stop()
            spec.listen = plan.listen
        if plan.upstream != spec.upstream:
            # As Toxiproxy: a new upstream restarts the proxy, dropping its connections.
            runtime.drop_links()
            spec.upstream = plan.upstream
        spec.enabled = plan.enabled
        return spec

    def delete(self, name: str) -> None:
        self.registry.remove(name)
        self.runtimes.pop(name).stop()

    async def populate(self, body: object) -> list[ProxySpec]:
        """Create or replace each proxy; one whose listen and upstream are unchanged is kept as is."""
        result = []
        for spec in self.registry.plan_populate(body):
            existing = self.registry.proxies.get(spec.name)
            if existing is not None and existing.listen == spec.listen and existing.upstream == spec.upstream:
                result.append(existing)
                continue
            if existing is not None:
                self.delete(spec.name)
            result.append(await self._install(spec))
        return result

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        for name, spec in self.registry.proxies.items():
            runtime = self.runtimes[name]
            spec.toxics.clear()
            runtime.toxics_changed()
            await runtime.start()
            spec.enabled = True

    def toxics(self, name: str) -> list[dict[str, object]]:
        return self.registry.get(name).toxics_json()

    def get_toxic(self, name: str, toxic: str) -> ToxicSpec:
        return self.registry.get_toxic(name, toxic)

    def add_toxic(self, name: str, body: object) -> ToxicSpec:
        toxic = self.registry.add_toxic(name, body)
        self.runtimes[name].toxics_changed()
        return toxic

    def update_toxic(self, name: str, toxic: str, body: object) -> ToxicSpec:
        updated = self.registry.update_toxic(name, toxic, body)
        self.runtimes[name].toxics_changed()
        return updated

    def remove_toxic(self, name: str, toxic: str) -> None:
        self.registry.remove_toxic(name, toxic)
        self.runtimes[name].toxics_changed()

    async def close(self) -> None:
        for runtime in list(self.runtimes.values()):
            await runtime.close()
        self.runtimes.clear()
        self.registry.proxies.clear()
