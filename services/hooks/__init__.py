"""The delivery worker of users' outbound webhooks (``safedelivr hooks``)."""
