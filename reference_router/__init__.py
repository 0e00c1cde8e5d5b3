"""Reference PD router: the oracle with correct health and engine-id semantics."""
