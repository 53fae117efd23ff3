"""Tests: unit (pure logic), integration (real RabbitMQ and Cassandra), end to end."""
