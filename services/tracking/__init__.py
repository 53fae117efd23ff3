"""The tracking process: the open pixel, tracked links and one-click unsubscribe."""
