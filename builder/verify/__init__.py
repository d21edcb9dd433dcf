"""Verify: rebuild a locked row in an empty private storage and compare it, layer by layer, with the lock and what is tagged."""
