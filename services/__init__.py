"""Safedelivr's deployable services; each one imports `shared`, never another service."""
