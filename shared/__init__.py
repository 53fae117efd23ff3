"""Safedelivr's shared core: configuration, domain model, broker topology, storage and providers."""
