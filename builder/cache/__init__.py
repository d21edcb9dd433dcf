"""The host's content-keyed caches (wheels, .debs): everything a build reads is fetched here first, verified by hash, and mounted read-only."""
