"""The send path's data and decisions: acceptance, batches, recipients, attempts, hand-off,
precedence, schedules, domain capacity, stats and the outbox."""
