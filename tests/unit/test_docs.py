"""The user documentation stays true: generated parts equal their generator, cited figures are in their JSON,
links and anchors resolve, and the pages speak to users (no development history, each page says who it is for)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RESEARCH = REPO / "research" / "README.md"  # the finished studies: what each measured, where its result is
MARKDOWN = DOCS + [REPO / "CHANGELOG.md", *sorted(REPO.glob("data/**/README.md")),
                   *sorted(REPO.glob("tests/cases/**/README.md")), *sorted(REPO.glob("docs/**/README.md")), RESEARCH]


def _script(name: str):
    """A script of scripts/ as a module (they are run as files, not installed)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_and_default_yaml_are_what_the_models_generate():
    gen = _script("gen_config_docs")
    stale = [str(path.relative_to(REPO)) for path in gen.stale()]
    assert not stale, f"{', '.join(stale)} out of date with src/kbflow/config/schema.py: run {gen.COMMAND}"


def test_default_yaml_is_the_built_in_defaults_and_every_setting_is_documented():
    from kbflow.config import KbConfig

    gen = _script("gen_config_docs")
    loaded = KbConfig.model_validate(yaml.safe_load((REPO / "configs" / "default.yaml").read_text()))
    assert loaded.model_dump() == KbConfig(**gen.YAML_EXAMPLE_VALUES).model_dump()
    reference = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    settings = [setting for _, group in gen.sections(KbConfig) for setting in group]
    assert len(settings) > 100
    for setting in settings:
        assert f"| `{setting.dotted}` |" in reference, setting.dotted
        assert setting.info.description, f"{setting.dotted} has no description in src/kbflow/config/schema.py"


def test_every_figure_cited_next_to_a_benchmark_json_is_in_that_json():
    checker = _script("check_figures")
    figures, problems = checker.check()
    assert not problems, "\n".join(problems) + "\n(.venv/bin/python scripts/check_figures.py --list shows each one)"
    assert len(figures) >= 40  # the convention is in use: a parser that found nothing would pass


def test_the_figure_check_fails_on_a_wrong_figure(tmp_path):
    checker = _script("check_figures")
    (tmp_path / "docs" / "bench").mkdir(parents=True)
    (tmp_path / "docs" / "bench" / "overhead.json").write_text(
        '{"warm_s": 0.272, "search_s": 0.107, "rows": 1000000, "p50_ms": 1396.2}')
    page = tmp_path / "README.md"
    page.write_text("warm `add_text` **0.27 s** ([overhead.json](docs/bench/overhead.json#warm_s)); 1M rows at\n"
                    "p50 1.4 s ([same](docs/bench/overhead.json)).\n\n| mode | warm s | source |\n|---|---:|---|\n"
                    "| direct | 0.27 | [overhead.json](docs/bench/overhead.json#warm_s) |\n")
    figures, problems = checker.check(tmp_path)
    assert [f.text for f in figures] == ["0.27 s", "1M", "1.4 s", "0.27"] and problems == []
    for wrong in ("~0.1 s", "0.2 s", "0.28 s", "3.1 / 24.3 s"):  # ~0.1 s: a number elsewhere in the file (0.107)
        page.write_text(f"warm `add_text` {wrong}\n([overhead.json](docs/bench/overhead.json#warm_s))\n")
        assert checker.check(tmp_path)[1], wrong
    page.write_text("| direct | 0.3 | [overhead.json](docs/bench/overhead.json#warm_s) |\n")
    assert not checker.check(tmp_path)[1]  # 0.272 written at one decimal
    page.write_text("| direct | 0.28 | [overhead.json](docs/bench/overhead.json#warm_s) |\n")
    assert checker.check(tmp_path)[1]
    page.write_text("p50 1.4 s ([gone](docs/bench/missing.json))\n")
    assert "does not exist" in checker.check(tmp_path)[1][0]
    page.write_text("p50 1.4 s ([typo](docs/bench/overhead.json#p50_msec))\n")
    assert "no number under" in checker.check(tmp_path)[1][0]


# words and paths of the project's own history, which a user cannot follow
HISTORY = re.compile(
    r"\b(?:this|the last|the previous|an earlier|the next|at the last|since the last) stop\b|\bacross stops\b"
    r"|\bstop \d+|\bissue \d+|\bthe issue(?:'s)?\b|\bGPU was lent\b"
    r"|\.\./shared/|/work/shared|\bshared corpora\b", re.IGNORECASE)


@pytest.mark.parametrize("page", [*DOCS, RESEARCH], ids=lambda p: str(p.relative_to(REPO)))
def test_docs_speak_to_users_not_about_the_project_history(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    hits = [f"{page.name}:{n}: {m.group(0)!r}" for n, line in enumerate(lines, 1) for m in HISTORY.finditer(line)]
    assert not hits, "development history belongs in CHANGELOG.md:\n" + "\n".join(hits)


@pytest.mark.parametrize("page", [p for p in DOCS if p.parent.name == "docs"], ids=lambda p: p.name)
def test_each_docs_page_opens_with_who_it_is_for(page):
    lines = [line for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines[0].startswith("# ") and lines[1].startswith("For "), \
        f"{page.name}: the line after the title should say who the page is for ('For ...')"


def github_anchor(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors_of(page: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        if in_fence or not re.match(r"#{1,6} ", line):
            continue
        anchor = github_anchor(line.lstrip("#"))
        found.add(anchor if anchor not in counts else f"{anchor}-{counts[anchor]}")
        counts[anchor] = counts.get(anchor, 0) + 1
    return found


def _links(page: Path):
    in_fence = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for match in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            yield number, match.group(1)


@pytest.mark.parametrize("page", [p for p in MARKDOWN if p.is_file()], ids=lambda p: str(p.relative_to(REPO)))
def test_links_between_pages_and_their_anchors_resolve(page):
    broken = []
    for number, target in _links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors_of(path):
            broken.append(f"{page.name}:{number}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_anchor_rule_matches_github():
    assert github_anchor(" Graph search (`--mode graph`)") == "graph-search---mode-graph"
    assert github_anchor(" The knowledge base in object storage") == "the-knowledge-base-in-object-storage"
    assert github_anchor(" deploy.schedules[]") == "deployschedules"


def test_the_source_kinds_table_is_the_registry():
    """docs/architecture.md shows each source kind's identity, confinement, fetch and change as the registry says."""
    from kbflow.sources import kinds_table

    assert kinds_table() in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
