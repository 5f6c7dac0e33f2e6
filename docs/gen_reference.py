"""Write the manual's reference pages from the code (run by `make docs` before `mkdocs build`).

- `docs/reference/settings.md`: every field of `jobq.config.Settings`, with its environment
  variable, type, default and description (the field's docstring in `jobq/config.py`).
- `docs/reference/http-api.md` and `docs/reference/openapi.json`: every operation of the
  service's OpenAPI document, as `create_app()` serves it at `/openapi.json` (no database needed).

Also checks that every link from README.md into docs/ names a file that exists.
Exit code 1 (with the reason on stderr) when a setting has no description or a link is broken.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import sys
import typing
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo

from jobq.app import create_app
from jobq.config import PROJECT_ROOT, Settings

DOCS = PROJECT_ROOT / "docs"
REFERENCE = DOCS / "reference"

# Settings whose field in jobq/config.py has no docstring yet. A docstring there wins over
# these; delete an entry once its field has one.
UNDOCUMENTED = {
    "pgdata_dir": "Where the embedded PostgreSQL keeps its data (used when `DATABASE_URL` is "
    "unset).",
    "http_host": "The address `make run` (and `serve`) listens on.",
    "http_port": "The port `make run` (and `serve`) listens on.",
    "max_body_bytes": "Larger request bodies get 413, whatever the method.",
    "min_pool_size": "Pooled connections each web process keeps open (a worker process keeps one).",
    "max_pool_size": "Pooled connections per process, at most.",
    "db_command_timeout": "Limit on one SQL statement.",
    "poll_interval": "The safety-net poll of an idle worker (wake-ups are by NOTIFY and timers).",
    "rescue_interval": "How often the leader looks for jobs of dead or hung workers.",
    "drain_timeout": "How long a stopping worker lets running jobs finish (and a stopping web "
    "process its requests) before it cancels and releases them.",
    "backoff_base": "Retry delay after the first failed attempt; it doubles with each attempt.",
    "backoff_max": "The longest retry delay.",
    "webhook_secret": "The Standard Webhooks secret that signs webhook deliveries (`whsec_...`).",
    "log_level": "`DEBUG`, `INFO`, `WARNING` or `ERROR`.",
    "crash_loop_restarts": "`run`: restarts of one child within `crash_loop_window` that make "
    "a crash loop.",
    "reminder_host_rate_period": "The period of `reminder_host_rate`.",
}


def field_docstrings() -> dict[str, str]:
    """Return each `Settings` field's docstring (the string literal under it), by field name."""
    tree = ast.parse((PROJECT_ROOT / "jobq" / "config.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    found: dict[str, str] = {}
    for node, after in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = after.value.value
    return found


def env_name(name: str, info: FieldInfo) -> str:
    """The environment variable of a field: the upper-case choice of its alias."""
    alias = info.validation_alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias or name]
    return next(str(c) for c in choices if str(c).isupper())


def type_text(annotation: Any, metadata: list[Any]) -> str:
    """A reader's name for a setting's type, as written in the environment."""
    text = repr(annotation)
    if annotation is timedelta:
        return "seconds"
    if annotation is bool:
        return "boolean"
    if annotation in (int, float, str):
        kind = {int: "integer", float: "number", str: "string"}[annotation]
        bounds = [
            f"{symbol} {getattr(m, attr)}"
            for m in metadata
            for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
            if getattr(m, attr, None) is not None
        ]
        return f"{kind} ({', '.join(bounds)})" if bounds else kind
    if typing.get_origin(annotation) is typing.Literal:
        return " \\| ".join(f"`{choice}`" for choice in typing.get_args(annotation))
    if "SecretStr" in text:
        return "string (secret)"
    if "Path" in text:
        return "path"
    if "dict" in text:
        return "`name:slots`, comma-separated"
    if "frozenset" in text:
        return "integers, comma-separated"
    if "tuple" in text:
        return "names, comma-separated"
    return text


def default_text(info: FieldInfo) -> str:
    """A field's default as it would be written in the environment."""
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, timedelta):
        value = f"{value.total_seconds():g}"
    elif isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, Path):
        value = value.relative_to(PROJECT_ROOT) if value.is_relative_to(PROJECT_ROOT) else value
    elif isinstance(value, frozenset):
        value = ",".join(str(v) for v in sorted(value))
    elif isinstance(value, dict | tuple) and not value:
        return "empty"
    return f"`{value}`"


def settings_page() -> str:
    """The settings reference; raises `SystemExit` when a setting has no description."""
    docstrings = field_docstrings()
    names = {name: env_name(name, info) for name, info in Settings.model_fields.items()}
    missing = [n for n in names if not (docstrings.get(n) or UNDOCUMENTED.get(n))]
    if missing:
        raise SystemExit(f"gen_reference: settings without a description: {', '.join(missing)}")
    rows = []
    for name, info in Settings.model_fields.items():
        text = " ".join((info.description or docstrings.get(name) or UNDOCUMENTED[name]).split())
        # `field_name` in a docstring reads as its environment variable here
        text = re.sub(r"`(\w+)`", lambda m: f"`{names.get(m[1], m[1])}`", text)
        kind = type_text(info.annotation, info.metadata)
        text = text.replace("|", "\\|")
        rows.append(f"| `{names[name]}` | {kind} | {default_text(info)} | {text} |")
    return "\n".join(
        [
            "# Settings",
            "",
            "Generated from `jobq.config.Settings` by `docs/gen_reference.py` (`make docs`).",
            "",
            "Settings come from the environment, then `.env` in the working directory, then these",
            "defaults. Durations are in seconds. See [Configuration](../guides/configuration.md).",
            "",
            "| variable | type | default | meaning |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )


async def openapi_document() -> dict[str, Any]:
    """The document `/openapi.json` serves, built without a database."""
    app = create_app(Settings())
    async with app.app_context():
        document: dict[str, Any] = app.extensions["QUART_SCHEMA"].openapi_provider.schema()
    return document


def schema_text(schema: dict[str, Any]) -> str:
    """A short, plain rendering of a JSON schema: `Reminder`, `string (date-time)`, ..."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in schema:
        parts = [schema_text(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(parts) + (" or null" if nullable else "")
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {schema_text(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        extra = schema["additionalProperties"]
        if isinstance(extra, dict) and extra:
            return f"object of {schema_text(extra)}"
    notes = [schema["format"]] if "format" in schema else []
    for key, symbol in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
    ):
        if key in schema:
            value = schema[key]
            whole = isinstance(value, float) and value.is_integer()
            notes.append(f"{symbol} {int(value) if whole else value}")
    return f"{kind} ({', '.join(notes)})" if notes else str(kind)


def one_line(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def api_page(document: dict[str, Any]) -> str:
    """The HTTP API reference: every operation, then every schema."""
    schemes = {"api_key": "the user's API key", "admin_token": "the admin token"}
    lines = [
        "# HTTP API",
        "",
        "Generated from the service's OpenAPI document (`/openapi.json`, built by `create_app()`)",
        "by `docs/gen_reference.py` (`make docs`). The document itself:",
        '[openapi.json](openapi.json). Errors are JSON, `{"error": <code>, "detail": ...}`:',
        "see [Using the API](../guides/api.md#errors).",
        "",
    ]
    operations = [
        (path, method, op) for path, ops in document["paths"].items() for method, op in ops.items()
    ]
    lines += ["| operation | what |", "|---|---|"]
    for path, method, op in operations:
        anchor = op["operationId"].replace("_", "-")
        whole = one_line(f"{op.get('summary', '')} {op.get('description', '')}")
        summary = whole.split(". ")[0].rstrip(".")
        lines.append(f"| [`{method.upper()} {path}`](#{anchor}) | {summary} |")
    lines.append("")
    for path, method, op in operations:
        lines += [f"## `{method.upper()} {path}` {{#{op['operationId'].replace('_', '-')}}}", ""]
        lines += [one_line(f"{op.get('summary', '')} {op.get('description', '')}"), ""]
        security = [name for entry in op.get("security", []) for name in entry]
        auth = " or ".join(schemes.get(s, s) for s in security) or "none"
        lines += [f"Authorization: {auth}.", ""]
        if op.get("parameters"):
            lines += ["| parameter | in | required | type | description |", "|---|---|---|---|---|"]
            for p in op["parameters"]:
                lines.append(
                    f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'}"
                    f" | {schema_text(p.get('schema', {}))} | {one_line(p.get('description'))} |"
                )
            lines.append("")
        body = op.get("requestBody", {}).get("content", {})
        for media, content in body.items():
            lines += [f"Body ({media}): {schema_text(content.get('schema', {}))}.", ""]
        lines += ["| status | answer |", "|---|---|"]
        for status, response in op["responses"].items():
            contents = response.get("content", {})
            bodies = ", ".join(
                f"{schema_text(c.get('schema', {}))} ({media})"
                for media, c in contents.items()
                if c.get("schema", {}).get("$ref") != "#/components/schemas/Error"
            )
            text = one_line(response.get("description"))
            lines.append(f"| {status} | {text}{' Body: ' + bodies if bodies else ''} |")
        lines.append("")
    lines += ["## Schemas", ""]
    for name, schema in document["components"]["schemas"].items():
        lines += [f"### {name} {{#{name.lower()}}}", ""]
        if schema.get("description"):
            lines += [one_line(schema["description"]), ""]
        if "enum" in schema:
            lines += [f"One of {schema_text(schema)}.", ""]
        if "properties" in schema:
            required = set(schema.get("required", []))
            lines += ["| field | type | required | description |", "|---|---|---|---|"]
            for field, spec in schema["properties"].items():
                lines.append(
                    f"| `{field}` | {schema_text(spec)} | {'yes' if field in required else 'no'}"
                    f" | {one_line(spec.get('description'))} |"
                )
            lines.append("")
    return "\n".join(lines)


def check_readme_links() -> list[str]:
    """Return the links from README.md into docs/ whose file does not exist."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    return [t for t in targets if not (PROJECT_ROOT / t).exists()]


def main() -> int:
    REFERENCE.mkdir(exist_ok=True)
    (REFERENCE / "settings.md").write_text(settings_page())
    document = asyncio.run(openapi_document())
    (REFERENCE / "openapi.json").write_text(json.dumps(document, indent=2) + "\n")
    (REFERENCE / "http-api.md").write_text(api_page(document))
    broken = check_readme_links()
    if broken:
        print(f"gen_reference: README.md links to missing files: {broken}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
