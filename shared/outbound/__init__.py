"""Users' webhooks ("hooks"): the events we tell users, their queue and store, signing, retries and
the guard against requests to private addresses."""
