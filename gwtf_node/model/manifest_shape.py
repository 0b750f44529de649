"""The JSON shape of a run manifest: each field has the type its dataclass is built from.

`manifest.py` builds frozen dataclasses from the parsed JSON and then checks
their values (`RunManifest.validate`).  Building them from a value of the wrong
JSON type fails in ways that name no field ("'float' object is not iterable"
for `betas: 0.9`) or, worse, succeeds wrongly (a string where a list of stages
belongs iterates into characters: `stages: "two"` became `('t',)`).  So the
shapes are checked first, here, and each mistake is one message naming the
field, what it holds and what it must be.  Values (ranges, choices, the stage
cut) stay with `validate`.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

TOP_REQUIRED = ("run_name", "model", "stages", "data", "train")


def json_type(v: Any) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_section(d: dict, name: str, known: set[str], required: Sequence[str], error: type[Exception]) -> None:
    """Section `name` is an object whose fields are among `known`, with the `required` ones present."""
    sec = d[name]
    if not isinstance(sec, dict):
        raise error(f"{name} is {json_type(sec)}; it must be an object with the fields {', '.join(sorted(known))}")
    unknown = sorted(set(sec) - known)
    if unknown:
        raise error(f"{name} has unknown field(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}")
    for key in required:
        if key not in sec:
            raise error(f"manifest is missing the field '{name}.{key}'")


def check_shapes(d: dict, sections: Mapping[str, tuple[set[str], Sequence[str]]], *, default_betas: list[float],
                 error: type[Exception]) -> None:
    """Raise `error` naming the first field of `d` whose JSON type is wrong.

    `sections` maps each section ("model", "data", "train") to its known and its required fields.
    """
    for key in TOP_REQUIRED:
        if key not in d:
            raise error(f"manifest is missing the field {key!r}")
    for name, (known, required) in sections.items():
        _check_section(d, name, known, required, error)
    config = d["model"]["config"]
    if not isinstance(config, dict):
        raise error(f"model.config is {json_type(config)}; it must be an object of HF config keyword arguments, "
                    'e.g. {"hidden_size": 64, ...}')
    stages = d["stages"]
    if not isinstance(stages, list):
        raise error(f"stages is {stages!r} ({json_type(stages)}); it must be a list of [start, end) layer ranges, "
                    "e.g. [[0, 2], [2, 4]]")
    for k, s in enumerate(stages):
        if not isinstance(s, list):
            raise error(f"stages[{k}] is {s!r} ({json_type(s)}); a stage is a [start, end) pair of layer indices, "
                        "e.g. [0, 2]")
    source = d["data"]["source"]
    if not isinstance(source, (str, list)):
        raise error(f"data.source is {source!r} ({json_type(source)}); use \"bundled\" or a list of .txt / .jsonl "
                    "file paths")
    betas = d["train"].get("betas", default_betas)
    if not isinstance(betas, list) or len(betas) != 2 or not all(_is_number(b) for b in betas):
        raise error(f"train.betas is {betas!r}; give a list of two numbers in [0, 1), e.g. [0.9, 0.95]")
