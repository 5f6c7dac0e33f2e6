"""`/exports/<id>`: the caller's own exports (another user's answer 404), their iCalendar
files once done, and their deletion."""

from __future__ import annotations

import contextlib

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response, current_app, jsonify, request, url_for
from quart_schema import document_response, validate_querystring

from jobq.api.auth import current_user_id, user_only
from jobq.config import Settings
from jobq.db import read_transaction, write_transaction
from jobq.domain import exports
from jobq.domain.exports import Export, ExportStatus
from jobq.errors import Conflict, NotFound
from jobq.queue import control

bp = Blueprint("exports", __name__)

CALENDAR = "text/calendar"


@read_transaction
async def _file(export_id: int) -> Response:
    content = await exports.export_file(export_id, current_user_id())
    if content is None:
        raise Conflict("the export is not done yet", export_id=export_id)
    return Response(
        content,
        content_type=f"{CALENDAR}; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="reminders-{export_id}.ics"'},
    )


class ExportQuery(BaseModel):
    """`GET /exports/<id>` query: `wait` (seconds, 0-60, default 0): while the export is
    pending, answer as soon as it is done (or failed), or after that long."""

    model_config = ConfigDict(extra="forbid")

    wait: float = Field(default=0, ge=0, le=60)


@bp.get("/exports/<int:export_id>")
@user_only
@validate_querystring(ExportQuery)
@document_response(Export)
async def get_export(export_id: int, query_args: ExportQuery) -> Response:
    """The export's status (JSON); with `Accept: text/calendar` (preferred over JSON), a 303 to
    its file (`/exports/<id>.ics`: one media type per answer, which generated clients can
    read). With `wait`, a pending export's answer comes the moment its job finishes (no
    polling), or after `wait` seconds; no transaction is held meanwhile."""
    export = await _export(export_id)
    if query_args.wait > 0 and export.status is ExportStatus.PENDING and export.job_id:
        with contextlib.suppress(NotFound):  # its job is gone: the status says what became of it
            await control.await_end(export.job_id, query_args.wait)
        export = await _export(export_id)
    if request.accept_mimetypes.best_match(["application/json", CALENDAR]) == CALENDAR:
        location = url_for("exports.download_export", export_id=export_id)
        return Response("", 303, headers={"Location": location})
    return jsonify(export.model_dump(mode="json"))


@read_transaction
async def _export(export_id: int) -> Export:
    return await exports.get_export(export_id, current_user_id())


@bp.get("/exports/<int:export_id>.ics")
@user_only
async def download_export(export_id: int) -> Response:
    """The iCalendar file once done; 409 before."""
    return await _file(export_id)


@bp.delete("/exports/<int:export_id>")
@user_only
@write_transaction
async def delete_export(export_id: int) -> tuple[str, int]:
    """Delete an export and its file (a pending one's job is cancelled): 204. What it took
    counts no more against `JOBQ_MAX_EXPORTS_PER_USER` and `JOBQ_MAX_EXPORT_BYTES_PER_USER`."""
    settings: Settings = current_app.extensions["jobq.settings"]
    await exports.delete_export(export_id, current_user_id(), retain=settings.retain)
    return "", 204
