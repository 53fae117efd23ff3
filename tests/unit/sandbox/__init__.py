"""Tests of the SendGrid, Mailgun and GitHub stand-ins."""
