"""SMTP submission (``safedelivr submission``): mail handed over by SMTP becomes a batch."""
