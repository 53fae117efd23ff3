"""Provider webhook receivers: verify, normalise and record recipient events."""
