"""Local stand-ins for SendGrid, Mailgun and GitHub that speak their real wire formats."""
