"""`/docs`: the API's OpenAPI document (`/openapi.json`) shown by Swagger UI, whose files the
service serves itself, from the pinned `swagger-ui-py` package: the page loads nothing from
elsewhere, works offline, and its Content-Security-Policy allows scripts from this origin only
(the page's own set-up is a file, `docs_page/docs.js`, not an inline script).

quart-schema's own pages (Swagger UI, ReDoc, Scalar) load their scripts from public CDNs, two
by a floating tag and none with an integrity hash, and set them up with inline scripts: they
are turned off (`jobq.app`). ReDoc and Scalar have no package on PyPI to serve them from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quart import Blueprint, Response, current_app, render_template, send_from_directory
from quart_schema import hide

PAGE_DIR = Path(__file__).parent / "docs_page"


def _swagger_ui_dir() -> Path:
    """The folder of Swagger UI's files in the `swagger-ui-py` package (found without
    importing it: only its files are used)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the swagger-ui-py package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
"""The page's policy: everything from this origin only (its API calls, "Try it out", too)."""

bp = Blueprint(
    "docs",
    __name__,
    static_folder=_swagger_ui_dir(),
    static_url_path="/docs/assets",
    template_folder=PAGE_DIR,
)
hide(Blueprint.send_static_file)


@bp.get("/docs")
@hide
async def docs() -> Response:
    """The API's documentation page (HTML)."""
    info = current_app.extensions["QUART_SCHEMA"].info
    html = await render_template("docs.html", title=info.title)
    return Response(
        html,
        content_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY},
    )


@bp.get("/docs/init.js")
@hide
async def init_script() -> Response:
    """The page's set-up script."""
    return await send_from_directory(PAGE_DIR, "docs.js", mimetype="text/javascript")
