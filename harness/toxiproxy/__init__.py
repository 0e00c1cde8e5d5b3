"""Network faults: an embedded Toxiproxy-compatible server (HTTP API + TCP proxies with toxics).

Drive it with the toxiproxy-python client like a real Toxiproxy; set TOXIPROXY_URL to use a real one.
"""

from harness.toxiproxy.server import (
    DEFAULT_PORT,
    EmbeddedToxiproxy,
    configure_client,
    toxiproxy_server,
    toxiproxy_url,
)

__all__ = ["DEFAULT_PORT", "EmbeddedToxiproxy", "configure_client", "toxiproxy_server", "toxiproxy_url"]
