"""In-memory twins of our I/O boundaries (stores, broker) for unit tests of the services'
shells; ``tests/contracts`` proves each twin behaves like the real thing."""
