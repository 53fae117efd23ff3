"""Recipient events applied: what the providers' webhooks and our tracking endpoint report, written
once to recipients' state, stats, the timeline, suppressions and users' webhooks."""
