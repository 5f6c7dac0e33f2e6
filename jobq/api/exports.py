"""`/exports/<id>`: the caller's own exports (another user's answer 404), and their iCalendar
files once done."""

from __future__ import annotations

from quart import Blueprint, Response, jsonify, request
from quart_schema import document_response

from jobq.api.auth import current_user_id, user_only
from jobq.db import read_transaction
from jobq.domain import exports
from jobq.domain.exports import Export
from jobq.errors import Conflict

bp = Blueprint("exports", __name__)

CALENDAR = "text/calendar"


async def _file(export_id: int) -> Response:
    content = await exports.export_file(export_id, current_user_id())
    if content is None:
        raise Conflict("the export is not done yet", export_id=export_id)
    return Response(
        content,
        content_type=f"{CALENDAR}; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="reminders-{export_id}.ics"'},
    )


@bp.get("/exports/<int:export_id>")
@user_only
@document_response(Export)
@read_transaction
async def get_export(export_id: int) -> Response:
    """The export's status (JSON); with `Accept: text/calendar` (preferred over JSON), the file
    once done (409 before)."""
    if request.accept_mimetypes.best_match(["application/json", CALENDAR]) == CALENDAR:
        return await _file(export_id)
    return jsonify((await exports.get_export(export_id, current_user_id())).model_dump(mode="json"))


@bp.get("/exports/<int:export_id>.ics")
@user_only
@read_transaction
async def download_export(export_id: int) -> Response:
    """The iCalendar file once done; 409 before."""
    return await _file(export_id)
