"""A deterministic simulator of the whole delivery path over the in-memory twins.

``make simulate`` runs the real services' code (acceptance, the outbox relay, the splitter,
the senders, the webhook intake and ingest, the scheduler, the campaign runner, the canary
judge, the users' webhook worker) as simulated processes on one thread, over the twins of
``tests/fakes``, with a virtual clock. Every I/O step of a scenario's fault-free run (each
store round trip, LWT, publish, ack, provider call, webhook delivery, users' webhook
delivery) is then run again with one fault injected at it, and seeded schedules of two to
four faults are drawn at random; after each run the invariants of ``simulation.invariants``
are checked at quiescence. A violation prints the smallest schedule that still breaks them,
which replays exactly with ``make simulate SCHEDULE=...``.

Anchors: FoundationDB's simulation testing (one thread, a simulated clock and network, every
fault injected deterministically), TigerBeetle's VOPR (seeded swarm runs, replay by seed) and
Jepsen's checkers (invariants over the history, not over log lines).
"""
