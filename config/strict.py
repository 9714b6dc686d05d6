"""The schema's shared base: every model of the fleet file is a :class:`Strict` model.

A strict model refuses keys it does not declare (a typo in the file is an error naming the
field, not a setting silently ignored) and is frozen (a loaded fleet is a value; a reload
builds a new one). :data:`PositiveFloat` and :data:`PositiveInt` are the constrained numbers
(> 0) the sections share. The file is described in docs/fleet-file.md, each section's schema in
docs/fleet-file-schema.md.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]


class Strict(BaseModel):
    """The base of every fleet-file model: unknown keys are refused, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)
