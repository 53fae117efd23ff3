"""Who may be mailed and who is: suppression lists and their cache, and campaigns to contact
lists."""
