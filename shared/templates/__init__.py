"""Stored templates, their versions and canaries, and rendering them safely in a pool of worker
processes."""
