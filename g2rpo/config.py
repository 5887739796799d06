"""Configuration as validated data.

Every concern (algorithm, model, data, trainer, rewards, storage, ...) defines its own section as a
frozen pydantic model deriving from :class:`Section`: each field carries help text
(``Field(description=...)``), unknown keys are rejected, and cross-field checks live in one
``model_validator`` per section. A run's config is a tree of sections.

One loader serves all of them:

- :func:`load_config` reads YAML (or starts from the defaults), applies ``key=value`` overrides
  (``algorithm.group_size=8``; values are parsed as YAML, so ``[1,2]`` is a list and ``null`` is
  None) and validates. Every problem is collected and raised at once as a :class:`ConfigError`
  that names the field, the value and the fix. Nothing is silently corrected.
- :func:`config_hash` hashes chosen sections (e.g. model + algorithm + data, not run length or
  output paths) so that a resume can refuse a checkpoint made under another config.
- :func:`describe` lists every field with its type, default and help (``g2rpo config describe``).

Cross-field checks raise ``ValueError(problem(field, value, fix))`` (see :func:`g2rpo.errors.problem`)
so the message already names the field.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import to_jsonable_python

from g2rpo.errors import ConfigError, G2RPOError, closest
from g2rpo.textfile import read_text_file

__all__ = [
    "Section",
    "ConfigError",
    "COUNT_MAX",
    "SEED_MAX",
    "STEPS_MAX",
    "MAX_SIDE",
    "GUIDANCE_MAX",
    "PROBLEM_SEPARATOR",
    "read_config_file",
    "empty_file_problem",
    "load_config",
    "parse_overrides",
    "deep_merge",
    "config_hash",
    "describe",
    "to_yaml",
]

S = TypeVar("S", bound=BaseModel)

# A section's cross-field check raises one ValueError (pydantic keeps one per validator) holding all
# its problems joined by this; the loader lists them one by one again.
PROBLEM_SEPARATOR = "\n  - "


# Bounds shared by the sections (every number of every section is bounded; a test walks the schema).
# torch.Generator.manual_seed takes [-2**63, 2**64 - 1] and raises "Overflow" past it, after the model
# has loaded: a seed is refused before. Counts (iterations, batch sizes, steps, timeouts) fit a 32-bit
# C int, what torch's sizes and DeepSpeed's settings take; anything near it is a typo, not a plan.
SEED_MAX = 2**64 - 1
COUNT_MAX = 2**31 - 1
# Sampler steps T: far past any real setting (paper 16, FluxPipeline 28-50); a grid of T holds T + 1
# σ and a few lists of T, built while the config is checked.
STEPS_MAX = 1000
# An image side in pixels: 8192 px is 512² packed tokens per image, far past what Flux was trained on
# (about 2 megapixels).
MAX_SIDE = 8192
# Flux's embedded guidance: FLUX.1-dev 3.5, its usable range a few units.
GUIDANCE_MAX = 100.0
# A config or gates file: the largest shipped one is ~3 KB; a file of a megabyte is the wrong file,
# and parsing one costs seconds of CPU before any check.
CONFIG_MAX_BYTES = 1 << 20
# YAML nodes a config may expand to, aliases counted as often as they are used: a few hundred in a
# real config; an alias bomb ("billion laughs") reaches billions from a few lines.
YAML_NODES_MAX = 100_000


def _expanded_nodes(node: yaml.Node, memo: dict[int, int], limit: int) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (each distinct node counted once
    per use, with memoisation so a bomb is measured in time linear in its text)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = limit + 1  # a cycle (a recursive alias) counts as over the limit
    total = 1
    if isinstance(node, yaml.SequenceNode):
        for child in node.value:
            total += _expanded_nodes(child, memo, limit)
            if total > limit:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            total += _expanded_nodes(k, memo, limit) + _expanded_nodes(v, memo, limit)
            if total > limit:
                break
    memo[key] = total
    return total


def safe_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document that expands past :data:`YAML_NODES_MAX` nodes
    (an alias bomb) before anything is constructed from it. Raises ``yaml.YAMLError`` as safe_load does."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count = _expanded_nodes(node, {}, YAML_NODES_MAX)
        if count > YAML_NODES_MAX:
            raise G2RPOError(
                f"{where} expands to more than {YAML_NODES_MAX:,} YAML nodes once its aliases (*name) are "
                "resolved (an alias bomb, or a recursive alias): write the values out, without nested aliases"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


class Section(BaseModel):
    """Base of every config section: frozen, unknown keys rejected, defaults validated, and no float
    infinite or NaN (a learning rate of inf passes ``gt=0``; the run would fail far from the cause)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @classmethod
    def unknown_key_fix(cls, key: str, path: str) -> str | None:
        """Where ``key`` belongs when it is not a field of this section (the section sits at the dotted
        ``path``, "" at the top), for the unknown-key message; None when it belongs nowhere known."""
        return None


# --------------------------------------------------------------------------- overrides


def parse_overrides(items: typing.Iterable[str]) -> dict[str, Any]:
    """Turn ``["a.b=3", "c=[1, 2]"]`` into ``{"a": {"b": 3}, "c": [1, 2]}``.

    Values are parsed as YAML scalars/flow collections. A malformed item raises a ConfigError
    naming it.
    """
    tree: dict[str, Any] = {}
    bad: list[str] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            bad.append(f"override {item!r}: write overrides as dotted.key=value, e.g. algorithm.group_size=8")
            continue
        try:
            value = safe_yaml(raw, f"override {item!r}") if raw.strip() else ""
        except yaml.YAMLError as exc:
            bad.append(f"override {item!r}: the value is not valid YAML ({exc.__class__.__name__}); quote it")
            continue
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                bad.append(f"override {item!r}: {part!r} was already set to a value, not a section")
                break
            node = child
        else:
            node[parts[-1]] = value
    if bad:
        raise ConfigError(bad, source="command-line overrides")
    return tree


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` over a copy of ``base``: nested dicts merge key by key; anything else, lists
    included, replaces the base's value. Neither argument is modified."""
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- loading


def read_config_file(path: str | Path | None, overrides: typing.Iterable[str] | dict[str, Any] = ()) -> dict[str, Any]:
    """The raw mapping a config file and its overrides give, before validation."""
    data = _read_yaml(Path(path)) if path is not None else {}
    return deep_merge(data, overrides if isinstance(overrides, dict) else parse_overrides(overrides))


def empty_file_problem(path: str | Path | None) -> str | None:
    """The problem to report when the config file holds no YAML at all (empty, or comments only):
    more likely a wrong or truncated file than a wish for every default, which ``{}`` states."""
    if path is None or _yaml_document(Path(path)) is not None:
        return None
    return (
        f"config file {str(path)!r} is empty (no YAML in it, or only comments): write the run's sections in it "
        "(`g2rpo config describe` lists them; configs/tiny-cpu.yaml is an example), or `{}` to take every "
        "default and set fields as KEY=VALUE overrides"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    data = _yaml_document(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise G2RPOError(
            f"config file {str(path)!r} holds a {type(data).__name__}, not a mapping of sections: "
            "write it as `section:` blocks of `key: value`"
        )
    return data


def _yaml_document(path: Path) -> Any:
    """The parsed YAML of a config file (None when it holds none)."""
    text = read_text_file(path, what="config file", max_bytes=CONFIG_MAX_BYTES)
    try:
        data = safe_yaml(text, f"config file {str(path)!r}")
    except yaml.YAMLError as exc:
        raise G2RPOError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
    return data


def _field_help(cls: type[BaseModel], loc: tuple[Any, ...]) -> tuple[str | None, type[BaseModel] | None]:
    """Help text of the field at ``loc`` and, for an unknown key, the section class it was found in."""
    model: Any = cls
    for i, part in enumerate(loc):
        if isinstance(part, int) and typing.get_origin(model) is list:  # an entry of a list of sections
            model = _unwrap_model(typing.get_args(model)[0])
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None, None
        fields = model.model_fields
        if part not in fields:
            return None, model if i == len(loc) - 1 else None
        info = fields[part]
        if i == len(loc) - 1:
            return info.description, None
        model = info.annotation if typing.get_origin(info.annotation) is list else _unwrap_model(info.annotation)
    return None, None


def _field_annotation(cls: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The annotation of the field at ``loc`` (None where ``loc`` leaves the sections)."""
    annotation: Any = cls
    for part in loc:
        model = _unwrap_model(annotation)
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
    return annotation


def _unwrap_model(annotation: Any) -> Any:
    """The BaseModel inside ``Optional[X]`` / ``X | None`` annotations, else the annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return annotation


def format_validation_error(cls: type[BaseModel], err: ValidationError) -> list[str]:
    """One line per pydantic error: the dotted field, the value found, what is wrong, the fix."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc) or "<top level>"
        kind = e["type"]
        value = e.get("input")
        if kind == "extra_forbidden":
            lines.append(unknown_key_problem(cls, loc))
            continue
        if kind == "value_error":
            # Cross-field checks already phrase field, value and fix themselves, several joined by
            # PROBLEM_SEPARATOR (each listed and counted on its own); a problem that names a field of the
            # failing section gets the section's dotted path in front of it.
            msg = str(e["msg"]).removeprefix("Value error, ")
            parts = msg.split(PROBLEM_SEPARATOR)
            if loc:
                section = _unwrap_model(_field_annotation(cls, loc))
                fields = section.model_fields if isinstance(section, type) and issubclass(section, BaseModel) else {}
                parts = [
                    f"{field}.{part}" if re.split(r"[.=]", part, maxsplit=1)[0] in fields else f"{field}: {part}"
                    for part in parts
                ]
            lines += parts
            continue
        help_text, _ = _field_help(cls, loc)
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        line = f"{field}={shown}: {e['msg']}"
        if kind == "missing":
            line = f"{field}: required but not set"
        if kind == "literal_error" and isinstance(value, str):
            choices = re.findall(r"'([^']*)'", str(e.get("ctx", {}).get("expected", "")))
            if match := closest(value, choices):
                line += f"; did you mean {match!r}?"
        if help_text:
            line += f" (expected: {help_text})"
        lines.append(line)
    return lines


def problem_field(line: str) -> str:
    """The dotted field a problem line names first (``algorithm.group_size`` of ``algorithm.group_size=1: …``):
    every line of :func:`format_validation_error`, :func:`unknown_key_problem` and
    :func:`g2rpo.errors.problem` starts with it, followed by ``=``, ``:`` or a space."""
    return re.split(r"[=:\s]", line, maxsplit=1)[0]


def unknown_key_problem(cls: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """``field: unknown key; ...`` for the key at ``loc`` of ``cls``'s tree: the valid keys of its
    section, where it belongs when a section knows (:meth:`Section.unknown_key_fix`), else the closest
    valid key — in its own section, else anywhere in the tree, section-qualified (``group_size`` →
    ``algorithm.group_size``)."""
    field = ".".join(str(p) for p in loc)
    key = str(loc[-1])
    _, section = _field_help(cls, loc)
    fix = "unknown key; remove it or fix the spelling"
    if section is None:
        return f"{field}: {fix}"
    fix += f" (valid keys here: {', '.join(sorted(section.model_fields))})"
    parent = ".".join(str(p) for p in loc[:-1])
    moved = section.unknown_key_fix(key, parent) if issubclass(section, Section) else None
    if moved:
        return f"{field}: {fix}; {moved}"
    prefix = f"{parent}." if parent else ""
    if match := closest(key, section.model_fields):
        return f"{field}: {fix}; did you mean {prefix}{match}?"
    paths = _key_paths(cls)
    by_leaf: dict[str, list[str]] = {}
    for path in paths:
        by_leaf.setdefault(path.rpartition(".")[2], []).append(path)
    # Across the whole tree only a near-certain guess: a short key is "close" to too much there.
    leaf = key if key in by_leaf else closest(key, by_leaf, cutoff=0.8)
    if leaf is not None:
        return f"{field}: {fix}; did you mean {' or '.join(by_leaf[leaf][:3])}?"
    return f"{field}: {fix}"


def _key_paths(cls: type[BaseModel], prefix: str = "", depth: int = 0) -> list[str]:
    """Every dotted key of ``cls``'s tree of sections (lists of sections not entered)."""
    paths = []
    for name, info in cls.model_fields.items():
        paths.append(f"{prefix}{name}")
        model = _unwrap_model(info.annotation)
        if depth < 8 and isinstance(model, type) and issubclass(model, BaseModel):
            paths += _key_paths(model, f"{prefix}{name}.", depth + 1)
    return paths


def unknown_keys(cls: type[BaseModel], data: Any, loc: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where ``data`` (a raw mapping) has keys that ``cls``'s tree of sections lacks. Pydantic reports
    these itself, except beside a section that fails as a whole (a default that does not validate
    ends the validation before the extra keys are looked at); :func:`load_config` adds them then."""
    if not isinstance(data, dict):
        return []
    found = []
    for key, value in data.items():
        if key not in cls.model_fields:
            found.append((*loc, key))
            continue
        annotation = cls.model_fields[key].annotation
        model = _unwrap_model(annotation)
        if isinstance(model, type) and issubclass(model, BaseModel):
            found += unknown_keys(model, value, (*loc, key))
        elif typing.get_origin(annotation) is list and isinstance(value, list):
            (item,) = typing.get_args(annotation) or (None,)
            item = _unwrap_model(item)
            if isinstance(item, type) and issubclass(item, BaseModel):
                for index, entry in enumerate(value):
                    found += unknown_keys(item, entry, (*loc, key, index))
    return found


def load_config(
    cls: type[S],
    path: str | Path | None = None,
    overrides: typing.Iterable[str] | dict[str, Any] = (),
) -> S:
    """Load ``cls`` from a YAML file (or its defaults), apply overrides, validate everything.

    Raises :class:`ConfigError` listing every problem at once; an empty config file is one of them.
    """
    data = read_config_file(path, overrides)
    empty = empty_file_problem(path)
    problems = [empty] if empty else []
    try:
        config = cls.model_validate(data)
    except ValidationError as err:
        problems += format_validation_error(cls, err)
        reported = {tuple(e["loc"]) for e in err.errors() if e["type"] == "extra_forbidden"}
        problems += [unknown_key_problem(cls, loc) for loc in unknown_keys(cls, data) if loc not in reported]
    if problems:
        raise ConfigError(problems, source=str(path) if path else None)
    return config


# --------------------------------------------------------------------------- hashing, help


def config_hash(config: BaseModel, sections: typing.Iterable[str] | None = None) -> str:
    """sha256 (hex, 16 chars) of the chosen sections' canonical JSON; all sections if None."""
    data = config.model_dump(mode="json")
    if sections is not None:
        data = {name: data[name] for name in sections}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def to_yaml(config: BaseModel) -> str:
    """The config as YAML, every default written out (what a run records next to its outputs)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def describe(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """``dotted.name (type, default): help`` for every field, recursing into sections."""
    out = []
    for name, info in cls.model_fields.items():
        dotted = f"{prefix}{name}"
        inner = _unwrap_model(info.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            out.append(f"{dotted}:  {info.description or ''}".rstrip())
            out += describe(inner, prefix=dotted + ".")
            continue
        type_name = type_description(info.annotation, info.metadata)
        default = (
            "required"
            if info.is_required()
            else "default "
            + json.dumps(to_jsonable_python(info.get_default(call_default_factory=True), exclude_none=True))
        )
        out.append(f"{dotted} ({type_name}; {default}): {info.description or ''}".rstrip())
    return out


_TYPE_NAMES = {int: "integer", float: "number", str: "string", bool: "true or false", Path: "path", type(None): "null"}
_PLURALS = {"integer": "integers", "number": "numbers", "string": "strings", "path": "paths", "section": "sections"}
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"))
_LENGTHS = (("min_length", "at least"), ("max_length", "at most"))


def _constraints(metadata: typing.Iterable[Any]) -> list[Any]:
    """The constraint objects of a field's metadata, those inside an ``Annotated`` FieldInfo included."""
    out = []
    for item in metadata:
        out += [item, *getattr(item, "metadata", ())]
    return [item for item in out if not isinstance(item, type)]


def type_description(annotation: Any, metadata: typing.Iterable[Any] = ()) -> str:
    """A field's type in words, with its bounds and allowed values: ``integer ≥ 2, ≤ 10000``,
    ``one of 'mean', 'sum'``, ``list of integers ≤ 1000, or null`` (not the validator's ``Annotated[...]``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_description(args[0], [*args[1:], *metadata])
    constraints = _constraints(metadata)
    if origin in (typing.Union, types.UnionType):
        kinds = [arg for arg in args if arg is not type(None)]
        if len(kinds) == 1:  # Optional: the field's bounds are the value's
            inner = type_description(kinds[0], metadata)
        else:
            inner = " or ".join(type_description(arg) for arg in kinds)
        return f"{inner}, or null" if len(kinds) < len(args) else inner
    bounds = [
        f"{word} {getattr(c, key)}" for c in constraints for key, word in _BOUNDS if getattr(c, key, None) is not None
    ]
    lengths = [
        f"{word} {getattr(c, key)} item{'' if getattr(c, key) == 1 else 's'}"
        for c in constraints
        for key, word in _LENGTHS
        if getattr(c, key, None) is not None
    ]
    if origin is typing.Literal:
        name = "one of " + ", ".join(json.dumps(value) for value in args)
    elif origin in (list, tuple, set, frozenset):
        items = [arg for arg in args if arg is not Ellipsis]
        kind = "tuple" if origin is tuple else "list"
        parts = [type_description(arg) for arg in items]
        if not parts:
            name = kind
        elif len(set(parts)) == 1 and (origin is not tuple or Ellipsis in args):
            head, _, rest = parts[0].partition(" ")
            words = rest.split(" ")
            if words[-1] in _PLURALS:  # "RewardModelConfig section" → "RewardModelConfig sections"
                name = f"{kind} of {head} {' '.join([*words[:-1], _PLURALS[words[-1]]])}"
            else:
                name = f"{kind} of {_PLURALS.get(head, head)}{' ' + rest if rest else ''}"
        else:
            name = f"{kind} of ({'; '.join(parts)})"
    elif origin is dict:
        key, value = (type_description(arg) for arg in args) if args else ("string", "value")
        name = f"mapping of {key} to {value}"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        name = f"{annotation.__name__} section"
    else:
        name = _TYPE_NAMES.get(annotation) or getattr(annotation, "__name__", None) or str(annotation)
    name = f"{name} {', '.join(bounds)}" if bounds else name
    return f"{name}, {', '.join(lengths)}" if lengths else name
