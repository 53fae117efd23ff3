"""The vocabulary every other package speaks: the domain model, addresses, lanes, errors, the
provider catalog, event names, batch ids and key rings (pure; imports nothing above it)."""
