"""RabbitMQ consumers: the batch splitter, provider senders and log retries."""
