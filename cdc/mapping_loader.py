"""Loading the CDC mapping named by ``CAUSEWAY_CDC_MAPPING``: a YAML/JSON file path or inline JSON.

The one place of ``cdc/`` that reads a file; the document is validated by ``cdc.mapping.parse_mapping``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml

from cdc.mapping import CdcMapping, MappingError, parse_mapping
from streams.settings import Settings


def load_mapping(spec: str | Path | Mapping[str, Any]) -> CdcMapping:
    """A validated mapping from a dict, a YAML/JSON file path, or inline JSON; raises MappingError."""
    origin = "CDC mapping"
    if isinstance(spec, Mapping):
        return parse_mapping(spec, origin)
    text = str(spec).strip()
    if text.startswith("{"):
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise MappingError([f"inline JSON does not parse: {exc}"], origin) from None
        return parse_mapping(doc, origin)
    path = Path(text)
    origin = f"CDC mapping {path}"
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise MappingError([f"cannot read the file: {exc}"], origin) from None
    try:
        doc = yaml.safe_load(raw)  # YAML is a superset of JSON: one loader for both
    except yaml.YAMLError as exc:
        raise MappingError([f"does not parse as YAML/JSON: {exc}"], origin) from None
    return parse_mapping(doc, origin)


def load_cdc_mapping(settings: Settings) -> CdcMapping:
    """The mapping named by ``CAUSEWAY_CDC_MAPPING``; raises MappingError (every problem listed)."""
    if not settings.cdc_mapping.strip():
        raise MappingError(["CAUSEWAY_CDC_MAPPING is not set: give a YAML/JSON file path or inline JSON"])
    return load_mapping(settings.cdc_mapping)
