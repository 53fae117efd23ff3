"""Open and click tracking and one-click unsubscribe: the signed tokens in the URLs we put into
mail, and rewriting messages to carry them."""
