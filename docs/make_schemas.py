"""Write the JSON schemas of a plan and of the reports into ``docs/schema/``, from the models.

    python docs/make_schemas.py [folder]

The schemas describe what ``model_dump_json()`` and the commands' ``--json`` print; they are
generated, never edited. ``tests/test_docs.py`` regenerates them and compares with the files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter

from k3layout.layouts.seams import rules_for
from k3layout.offload import LMCachePlan, RideReport
from k3layout.registry import engine_names
from k3layout.sweep import SweepCell
from k3layout.transfer import TransferPlan, TransferReport

SCHEMA = Path(__file__).parent / "schema"

DIALECT = "https://json-schema.org/draft/2020-12/schema"

PLAN_TYPES = tuple(rules_for(name).plan_type for name in engine_names())
"""Every registered engine's plan type: a plan is one of them, tagged by ``engine``."""

Plan: Any = Annotated[Union[PLAN_TYPES], Field(discriminator="engine")]  # noqa: UP007
Report: Any = Annotated[
    Union[tuple(t.report_type for t in PLAN_TYPES)],  # noqa: UP007
    Field(discriminator="engine"),
]

SOURCES: dict[str, tuple[str, Any]] = {
    "plan.schema.json": ("A k3layout plan: plan(model, deployment).model_dump_json()", Plan),
    "plan-report.schema.json": ("k3layout plan --json", Report),
    "ride-report.schema.json": ("k3layout ride --json", RideReport),
    "lmcache-plan.schema.json": ("k3layout ride --connector lmcache --json", LMCachePlan),
    "transfer.schema.json": ("A transfer plan: plan_transfer(...).model_dump_json()", TransferPlan),
    "transfer-report.schema.json": ("k3layout transfer --json", TransferReport),
    "sweep-cells.schema.json": ("k3layout sweep --json", tuple[SweepCell, ...]),
}
"""File name -> (what the schema describes, the type it is generated from)."""


def schemas() -> dict[str, str]:
    """File name -> the schema's text (sorted keys, two-space indent, a final newline)."""
    texts: dict[str, str] = {}
    for name, (description, kind) in SOURCES.items():
        schema = TypeAdapter(kind).json_schema(mode="serialization")
        schema = {"$schema": DIALECT, "description": description, **schema}
        texts[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return texts


def main(folder: Path = SCHEMA) -> list[Path]:
    """Write every schema into ``folder``; returns the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in schemas().items():
        path = folder / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in main(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA):
        print(path)
