"""How the builder reaches registries: the loopback rule, the TLS and login policy, the registry token flow and HTTP client."""
