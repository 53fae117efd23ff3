"""``make chaos``: Safedelivr's own fault suite (see :mod:`chaos.run`)."""
