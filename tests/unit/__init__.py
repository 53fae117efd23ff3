"""Unit tests of pure logic; no services needed."""
