"""Integration tests against the real RabbitMQ and Cassandra started by deploy/."""
