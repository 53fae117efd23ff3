"""The HTTP API: batch submission, queries, keys, suppressions, stats and the dashboard."""
