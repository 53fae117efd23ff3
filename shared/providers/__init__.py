"""Email provider adapters behind one interface."""
