"""Users and what they own: accounts, API keys, sign-up, sending domains, preferences and the
per-key and per-user rate limits."""
