"""The dashboard: server-rendered pages of the API service (no separate front-end build).

``dashboard_routes()`` gives the pages and the ``/static`` mount to add to the API app;
``create_templates()`` the Jinja2 environment they render with (also made on first use),
and ``compile_pages()`` compiles its pages ahead of their first request.
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from services.api.dashboard import pages
from services.api.dashboard.campaign_pages import campaign_routes
from services.api.dashboard.lists import lists_routes
from services.api.dashboard.operations import operations_routes
from services.api.dashboard.pages import compile_pages, create_templates
from services.api.dashboard.preference_pages import preference_routes
from services.api.dashboard.template_pages import template_routes
from services.api.dashboard.webhook_pages import webhook_routes

__all__ = ["compile_pages", "create_templates", "dashboard_routes"]


def dashboard_routes() -> list[BaseRoute]:
    """Every page (the operators' too) and the static files."""
    return [
        *operations_routes(),
        *lists_routes(),
        *campaign_routes(),
        *template_routes(),
        *webhook_routes(),
        *preference_routes(),
        *pages.dashboard_routes(),
    ]
