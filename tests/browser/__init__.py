"""Browser tests of the dashboard (Playwright driving Debian's Chromium)."""
