"""What every process stands on: settings, Cassandra, RabbitMQ and its topology, leases, caches,
migrations and the process runtime (HTTP, health, metrics, logs, memory, stalls)."""
