"""`pdchaos-engine`: run one fake engine until SIGTERM/SIGINT (or a crash/death fault). SIGTERM is a graceful
stop: the engine refuses new work and exits once its in-flight requests and pending KV pulls are done."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys

from fake_engines.config import EngineConfig, config_from_args
from fake_engines.runtime import start_engine

READY_PREFIX = "PDCHAOS_ENGINE_READY"


async def serve(config: EngineConfig) -> int:
    loop = asyncio.get_running_loop()
    # SIGTERM: graceful stop (finish in-flight requests and the KV pulls decodes still owe, then exit);
    # SIGINT or a second SIGTERM: stop now.
    stop, now = asyncio.Event(), asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, lambda: now.set() if stop.is_set() else stop.set())
    loop.add_signal_handler(signal.SIGINT, lambda: (stop.set(), now.set()))
    stopper = asyncio.create_task(stop.wait())
    starter = asyncio.create_task(start_engine(config, process_exit=True))
    # A stop during the load time must not wait for the load to finish.
    await asyncio.wait({stopper, starter}, return_when=asyncio.FIRST_COMPLETED)
    if not starter.done():
        starter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starter
        return 0
    handle = starter.result()
    # The KV timeouts too: an incident bundle made of engine logs needs them to tell a transfer-timeout wait.
    ready = {**handle.state(), "transfer_timeout_s": config.transfer_timeout_s,
             "kv_abort_timeout_s": config.kv_abort_timeout_s}
    print(f"{READY_PREFIX} {json.dumps(ready, separators=(',', ':'))}", flush=True)
    closer = asyncio.create_task(handle.wait_closed())
    await asyncio.wait({stopper, closer}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set() and not now.is_set() and not closer.done():
        drainer = asyncio.create_task(handle.drain())
        hurry = asyncio.create_task(now.wait())
        await asyncio.wait({drainer, hurry, closer}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drainer, hurry):
            task.cancel()
    stopper.cancel()
    closer.cancel()
    await handle.close(exit_code=handle.exit_code)
    return handle.exit_code


def main(argv: list[str] | None = None) -> int:
    config = config_from_args(argv)
    logging.basicConfig(
        level=config.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s {config.name} %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(serve(config))
    except OSError as exc:
        print(f"pdchaos-engine: cannot serve: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
