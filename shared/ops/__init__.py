"""What operators run and watch: checks, reconciliation, upgrades, dead letters, alerts and live
settings."""
