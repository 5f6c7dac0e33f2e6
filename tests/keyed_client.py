"""A test client that carries users' API keys, so tests of the API read as users' sessions."""

from __future__ import annotations

import re
from typing import Any

from quart import Quart, Response
from quart.testing import QuartClient
from werkzeug.datastructures import Headers

_USER_PATH = re.compile(r"/users/(\d+)(/|$)")


class KeyedClient(QuartClient):
    """Keeps the `api_key` of each user it creates (a 201 from `POST /users`) and sends one
    (`Authorization: Bearer <key>`) with every request that has no `Authorization` header of
    its own: on `/users/<id>/...` that user's key when it created them, elsewhere (and for ids
    it did not create) the key of the user it created last. Set `key` to act as someone else
    (None: no key; then `keys` are not used either)."""

    key: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keys: dict[int, str] = {}

    async def open(self, path: str, *, headers: Any = None, **kwargs: Any) -> Response:
        sent = Headers(headers) if headers is not None else Headers()
        if self.key is not None and "Authorization" not in sent:
            match = _USER_PATH.match(path)
            key = self.keys.get(int(match.group(1)), self.key) if match else self.key
            sent["Authorization"] = f"Bearer {key}"
        response = await super().open(path, headers=sent, **kwargs)
        if kwargs.get("method") == "POST" and path == "/users" and response.status_code == 201:
            body = await response.get_json()
            self.key = self.keys[body["id"]] = body["api_key"]
        return response


def use_keyed_client(app: Quart) -> None:
    """Make `app.test_client()` return a `KeyedClient`."""
    app.test_client_class = KeyedClient  # type: ignore[assignment]
