"""The webhooks process: the providers' event webhooks verified, normalised and handed to
the ingest (``shared.ingest``), at once or through a durable queue."""
