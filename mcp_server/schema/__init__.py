"""Pydantic models of every file the tool writes, and their loading/saving."""

from mcp_server.schema.io import load_profile, write_json_atomic, write_model_atomic
from mcp_server.schema.profile import SCHEMA_VERSION, OperatorAttributedProfile

__all__ = [
    "SCHEMA_VERSION",
    "OperatorAttributedProfile",
    "load_profile",
    "write_json_atomic",
    "write_model_atomic",
]
