"""Write docs/configuration.md and configs/default.yaml from the configuration models in src/kbflow/config/schema.py.

Both files are generated: every setting, its type, default, description and environment-variable form come from
the pydantic models, so a field added there appears here after one command:

    .venv/bin/python scripts/gen_config_docs.py            # rewrite both files
    .venv/bin/python scripts/gen_config_docs.py --check    # exit 1 naming the stale file (tests/unit/test_docs.py)
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import annotated_types
import yaml
from pydantic import BaseModel, Discriminator, Tag
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from kbflow.config import ENV_PREFIX, KbConfig

REPO = Path(__file__).resolve().parents[1]
DOC_PATH = REPO / "docs" / "configuration.md"
YAML_PATH = REPO / "configs" / "default.yaml"
COMMAND = ".venv/bin/python scripts/gen_config_docs.py"
# configs/default.yaml is the config the quick start and `kbflow serve --config default` use: it ingests the bundled
# sample. Every other value in it is the built-in default.
YAML_EXAMPLE_VALUES = {"sources": ["data/sample"]}


@dataclass
class Setting:
    path: tuple[str, ...]  # ("search", "llm", "model"); a list item's fields carry "[]": ("deploy", "schedules[]", ..)
    info: FieldInfo
    annotation: object

    @property
    def dotted(self) -> str:
        return ".".join(self.path).replace(".[]", "[]")

    @property
    def env(self) -> str | None:
        if any(part.endswith("[]") for part in self.path):
            return None  # set the whole list instead
        return ENV_PREFIX + "__".join(part.upper() for part in self.path)


def _model_of(annotation) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _list_item_model(annotation) -> type[BaseModel] | None:
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        return _model_of(item)
    return None


class SectionPath(tuple):
    """A section's keys; ``variant`` names the choice ('backend: e5') of a section with one model per value of a
    field (the embedder), and ``model`` is the section's model."""

    variant: str = ""
    model: type[BaseModel] | None = None


def _section_path(keys: tuple[str, ...], variant: str, model: type[BaseModel]) -> SectionPath:
    path = SectionPath(keys)
    path.variant, path.model = variant, model
    return path


def _union_models(info: FieldInfo) -> tuple[str, list[type[BaseModel]]] | None:
    """(discriminator field, its models) of a field holding one of several models chosen by a field's value: by
    the field's name, or by a function choosing among tagged models (``Tag``), each tag a value of one field. A member
    without a tag of its own value (the embedder plugins' member) is not documented here."""
    if isinstance(info.discriminator, str):
        return info.discriminator, [arg for arg in typing.get_args(info.annotation) if _model_of(arg)]
    if not any(isinstance(item, Discriminator) for item in info.metadata):
        return None
    tagged = []
    for arg in typing.get_args(info.annotation):
        model, *marks = typing.get_args(arg)
        tags = [mark.tag for mark in marks if isinstance(mark, Tag)]
        if _model_of(model) and tags:
            tagged.append((model, tags[0]))
    first, first_tag = tagged[0]
    (field,) = [name for name, spec in first.model_fields.items() if typing.get_args(spec.annotation) == (first_tag,)]
    return field, [model for model, tag in tagged if typing.get_args(model.model_fields[field].annotation) == (tag,)]


def _variant(model: type[BaseModel], tag: str) -> str:
    (value,) = typing.get_args(model.model_fields[tag].annotation)
    return f"{tag}: {value}"


def sections(model: type[BaseModel], prefix: tuple[str, ...] = (),
             variant: str = "") -> list[tuple[tuple[str, ...], list[Setting]]]:
    """(section path, its plain settings) for the model and every nested section, in declaration order; a field
    holding one of several models (``embedder``: one per backend) gives one section per model."""
    own: list[Setting] = []
    nested: list[tuple[tuple[str, ...], list[Setting]]] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if _model_of(annotation):
            nested.extend(sections(annotation, prefix + (name,), variant))
            continue
        union = _union_models(info)
        if union:
            tag, models = union
            for choice in models:
                nested.extend(sections(choice, prefix + (name,), _variant(choice, tag)))
            continue
        own.append(Setting(prefix + (name,), info, annotation))
        item = _list_item_model(annotation)
        if item:
            nested.extend(sections(item, prefix + (name, "[]")))
    here = _section_path(prefix, variant, model)
    return [(here, own)] + nested if own or not prefix else nested


def _bounds(metadata) -> str:
    marks = []
    for item in metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None and isinstance(item, (annotated_types.BaseMetadata, FieldInfo)):
                marks.append(f"{sign} {value}")
        if isinstance(item, FieldInfo):
            marks.extend(m for m in [_bounds(item.metadata)] if m)
    return ", ".join(marks)


def render_type(annotation, metadata=()) -> str:
    """A reader's name for a field's type, with its bounds: 'integer (≥ 1, ≤ 64) or `auto`'."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return render_type(args[0], list(args[1:]) + list(metadata))
    if origin in (typing.Union, types.UnionType):
        optional = type(None) in args
        parts = [render_type(arg, metadata) for arg in args if arg is not type(None)]
        text = " or ".join(dict.fromkeys(parts))
        return f"{text}, or empty (null)" if optional else text
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in args) if len(args) > 1 else f"`{args[0]}`"
    if origin is list:
        item = args[0] if args else object
        model = _model_of(item)
        return f"list of {model.__name__.removesuffix('Config').lower()} entries" if model else \
            f"list of {render_type(item)}s"
    if origin is dict:
        return f"mapping of {render_type(args[0])} to {render_type(args[1])}" if args else "mapping"
    names = {int: "integer", float: "number", bool: "boolean", str: "string", Path: "path"}
    if annotation in names:
        bounds = _bounds(metadata)
        return f"{names[annotation]} ({bounds})" if bounds else names[annotation]
    return getattr(annotation, "__name__", str(annotation))


def default_of(setting: Setting):
    if setting.info.is_required():
        tag = typing.get_args(setting.annotation) if typing.get_origin(setting.annotation) is typing.Literal else ()
        return tag[0] if len(tag) == 1 else PydanticUndefined
    value = setting.info.get_default(call_default_factory=True)
    return _plain(value)


def _plain(value):
    if isinstance(value, BaseModel):
        return _plain(value.model_dump())
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def yaml_value(value) -> str:
    """One value in YAML flow style: `null`, `auto`, `[a, b]`, `'0 2 * * *'`."""
    text = yaml.safe_dump({"k": value}, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text[len("{k: "):-1]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _wrap_comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(" ".join(text.split()), 110 - len(indent),
                                                          break_on_hyphens=False, break_long_words=False)]


def render_markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "For anyone writing a kbflow config file or setting kbflow from the environment: every setting, its type, "
        "its default, what it does, and how to set it.",
        "",
        f"<!-- Generated from src/kbflow/config/schema.py by `{COMMAND}`; edit the models there, not this file. -->",
        "",
        "A setting is read, in this order (later wins):",
        "",
        "1. its built-in default (below; a plain install needs no config file);",
        "2. the YAML file given with `--config FILE` (`kbflow serve --config NAME` reads `configs/NAME.yaml`);",
        "   [configs/default.yaml](../configs/default.yaml) is every setting below written out;",
        f"3. the environment: `{ENV_PREFIX}SECTION__FIELD` sets one field, at any depth "
        f"(`{ENV_PREFIX}SEARCH__LLM__MODEL=qwen-plus`); the value is read as YAML, so `128`, `true` and `[a, b]` keep "
        "their types; names are case-insensitive. `KBFLOW_DATA_DIR` also sets `data_dir`;",
        "4. command-line flags such as `--namespace` and `--data-dir`.",
        "",
        "`kbflow config show [--config FILE] [--json]` prints every setting's effective value (`search.mode = "
        "\"hybrid\"`) and which of these it came from: the default, the file, the environment variable or the flag.",
        "",
        "Unknown keys and out-of-range values stop the command with an error naming the field. A config never "
        "holds a secret: settings ending in `_env` name the environment variable that holds it.",
        "",
    ]
    all_sections = sections(KbConfig)
    lines.append("Sections: " + " · ".join(f"[{_title(path)}](#{_anchor(path)})" for path, _ in all_sections))
    lines.append("")
    for path, settings in all_sections:
        lines += [f"## {_title(path)}", ""]
        if path.variant and path.model.__doc__ and path.variant.split(": ")[0] in path.model.model_fields:
            tag = path.variant.split(": ")[0]
            lines += [f"With `{'.'.join(path)}.{path.variant}`: {' '.join(path.model.__doc__.split())} The "
                      f"`{path[-1]}` section holds only the settings of its `{tag}` (one table per `{tag}`).", ""]
        if path and path[-1] == "[]":
            parent = ".".join(path[:-1])
            lines += [f"Each entry of the `{parent}` list has these fields; set the whole list from the environment "
                      f"as YAML: `{ENV_PREFIX}{'__'.join(p.upper() for p in path[:-1])}='[{{namespace: docs}}]'`.", ""]
        lines += ["| setting | type | default | environment variable | description |", "|---|---|---|---|---|"]
        for setting in settings:
            default = default_of(setting)
            shown = "required" if default is PydanticUndefined else f"`{yaml_value(default)}`"
            env = f"`{setting.env}`" if setting.env else "(the whole list)"
            description = setting.info.description or ""
            lines.append(f"| `{setting.dotted}` | {_cell(render_type(setting.annotation, setting.info.metadata))} | "
                         f"{_cell(shown)} | {env} | {_cell(description)} |")
        lines += ["", "```yaml", *_yaml_example(path, settings), "```", ""]
    return "\n".join(lines)


def _title(path: tuple[str, ...]) -> str:
    title = ".".join(path).replace(".[]", "[]") or "top level"
    return f"{title} ({getattr(path, 'variant', '')})" if getattr(path, "variant", "") else title


def _anchor(path: tuple[str, ...]) -> str:
    title = _title(path).lower()
    return "".join(ch for ch in title.replace(" ", "-") if ch.isalnum() or ch in "-_")


def _yaml_example(path: tuple[str, ...], settings: list[Setting]) -> list[str]:
    """The section's settings at their defaults, nested under the section's keys."""
    out, indent = [], ""
    for depth, part in enumerate(path):
        if part == "[]":
            out.append(f"{indent}- " + (f"{settings[0].path[-1]}: {_example(settings[0])}" if settings else ""))
            indent += "  "
            rest = settings[1:]
            out += [f"{indent}{s.path[-1]}: {_example(s)}" for s in rest]
            return out
        if depth + 1 < len(path) and path[depth + 1] == "[]":
            out.append(f"{indent}{part}:")
            continue
        out.append(f"{indent}{part}:")
        indent += "  "
    out += [f"{indent}{s.path[-1]}: {_example(s)}" for s in settings]
    return out


def _example(setting: Setting) -> str:
    default = default_of(setting)
    return "..." if default is PydanticUndefined else yaml_value(default)


def render_yaml() -> str:
    lines = [
        "# Every kbflow setting with its built-in default and what it does (docs/configuration.md has the types and",
        "# environment-variable forms). The one value that differs from the built-in defaults: `sources`, the",
        "# bundled sample, which the quick start ingests.",
        "# Generated from src/kbflow/config/schema.py by",
        f"# `{COMMAND}`: edit the models there, not this file.",
    ]
    lines += _yaml_model(KbConfig, (), "")
    return "\n".join(lines) + "\n"


def _yaml_model(model: type[BaseModel], path: tuple[str, ...], indent: str, values: dict | None = None) -> list[str]:
    lines: list[str] = []
    for name, info in model.model_fields.items():
        setting_path = path + (name,)
        nested = _model_of(info.annotation)
        union = _union_models(info)
        if union:  # written as the default's model; the reference has one table per choice
            tag = union[0]
            nested = type(info.get_default(call_default_factory=True))
            lines += ["", f"{indent}# one section per {tag}: docs/configuration.md#{name}-"
                          f"{tag}-{nested.model_fields[tag].default}"]
            lines += [f"{indent}{name}:"]
            lines += _yaml_model(nested, setting_path, indent + "  ", (values or {}).get(name))
            continue
        if nested:
            lines += ["", f"{indent}{name}:"]  # docs/configuration.md#<section path> has the section's table
            lines += _yaml_model(nested, setting_path, indent + "  ", (values or {}).get(name))
            continue
        if info.description:
            lines += _wrap_comment(info.description, indent)
        if values is not None and name in values:
            value = values[name]
        elif not path and name in YAML_EXAMPLE_VALUES:
            value = YAML_EXAMPLE_VALUES[name]
        else:
            value = default_of(Setting(setting_path, info, info.annotation))
        item = _list_item_model(info.annotation)
        if item and isinstance(value, list) and value:
            lines.append(f"{indent}{name}:")
            for entry in value:
                entry_lines = _yaml_model(item, setting_path, indent + "    ", entry)
                first = next(i for i, line in enumerate(entry_lines) if not line.lstrip().startswith("#"))
                entry_lines[first] = f"{indent}  - " + entry_lines[first].lstrip()
                lines += entry_lines
            continue
        lines.append(f"{indent}{name}: {yaml_value(value)}")
    return lines


def generated() -> dict[Path, str]:
    return {DOC_PATH: render_markdown(), YAML_PATH: render_yaml()}


def stale() -> list[Path]:
    return [path for path, text in generated().items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for path in out_of_date:
            print(f"{path.relative_to(REPO)} is out of date: run {COMMAND}", file=sys.stderr)
        return 1 if out_of_date else 0
    for path, text in generated().items():
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
