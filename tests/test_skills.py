"""The skills (src/kernelwright/skills/<name>/SKILL.md) against the code they describe.

- front matter: `name` is the folder's name, `description` is non-empty (and within the limits
  coding agents put on both);
- every `kernelwright ...` command written as a command (a line of a non-Python code block, or
  an inline code span) exists in the typer app, and every `--flag` after it on that line is an
  option of that command; a code span that is only a flag (`--yes`) must belong to one of the
  commands the same file names;
- every Python code block parses, and every kernelwright name it imports or reads exists, with
  the keyword arguments it passes;
- `kernelwright skills list` and `kernelwright skills install`.

AGENTS.md at the repository root is checked for commands, flags and paths the same way.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from kernelwright import skills
from kernelwright.cli import app

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ROOT / "AGENTS.md"
WORKFLOWS = ("create", "autopatch", "optimize")  # the CLI's workflows: each has a skill

FENCE = re.compile(r"^\s*```+\s*([\w+-]*)")
SPAN = re.compile(r"`([^`\n]+)`")
# `kernelwright` as a program: at the start or after whitespace or a shell operator, possibly
# with a path (.venv/bin/kernelwright), followed by an argument; not `import kernelwright as kw`
COMMAND = re.compile(r"(?<![^\s;&|(])(?:[\w.-]*/)*kernelwright(?=[ \t]+\S)")
NOT_A_COMMAND = re.compile(r"\b(?:import|from)\s+$")
FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
SHELL_BREAK = re.compile(r"\s(?:&&|\|\||\||;)\s")
REPO_PATH = re.compile(r"^(?:src|docs|tests|benchmarks|examples)/[\w./-]*$")
# folders `create --into-library` makes on first use: absent from a fresh checkout
WRITTEN_LATER = ("tests/generated", "benchmarks/generated")


def cli_root():
    """The app as typer builds it (a command group; typer >= 0.2x vendors its own click)."""
    return typer.main.get_command(app)


def is_group(cmd) -> bool:
    return isinstance(getattr(cmd, "commands", None), dict)


def flags_of(cmd) -> set[str]:
    out = {"--help"}
    for p in cmd.params:
        out.update(o for o in [*p.opts, *p.secondary_opts] if o.startswith("--"))
    return out


def segments(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(shell-like segments, Python blocks), each with its line number: every line of a
    non-Python code block and every inline code span outside blocks; Python blocks whole."""
    shell: list[tuple[int, str]] = []
    python: list[tuple[int, str]] = []
    lang, start, block = None, 0, []
    for n, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, start, block = fence.group(1).lower() or "text", n, []
        elif fence:
            if lang in ("python", "py"):
                python.append((start, "\n".join(block)))
            lang = None
        elif lang is not None:
            block.append(line)
            if lang not in ("python", "py", "yaml", "yml"):
                shell.append((n, line))
        else:
            shell += [(n, m.group(1)) for m in SPAN.finditer(line)]
    return shell, python


def cli_problems(text: str, root=None) -> list[str]:
    """Every command or flag `text` names that the CLI lacks, one sentence each."""
    root = root or cli_root()
    shell, _ = segments(text)
    problems: list[str] = []
    named: list = []
    standalone: list[tuple[int, str]] = []
    for n, seg in shell:
        words = seg.split()
        if words and words[0] in root.commands and FLAG.search(seg):
            seg = f"kernelwright {seg}"  # `create --into-library`: a command without its program
        found = [m for m in COMMAND.finditer(seg) if not NOT_A_COMMAND.search(seg[: m.start()])]
        if not found and seg.lstrip().startswith("--"):
            standalone += [(n, f) for f in FLAG.findall(seg)[:1]]
        for i, m in enumerate(found):
            end = found[i + 1].start() if i + 1 < len(found) else len(seg)
            rest = seg[m.end() : end]
            cut = SHELL_BREAK.search(rest)
            rest = rest[: cut.start()] if cut else rest
            cmd, path = root, ["kernelwright"]
            for tok in rest.split():
                if not is_group(cmd) or tok.startswith("-"):
                    break
                sub = cmd.commands.get(tok)
                if sub is None:
                    problems.append(f"line {n}: `{' '.join(path)} {tok}`: no such command")
                    cmd = None
                    break
                cmd, path = sub, [*path, tok]
            if cmd is None:
                continue
            named.append(cmd)
            known = flags_of(cmd)
            problems += [
                f"line {n}: `{' '.join(path)}` has no option {flag}"
                for flag in FLAG.findall(rest)
                if flag not in known
            ]
    known_here = set().union(*(flags_of(c) for c in named)) if named else set()
    for n, flag in standalone:
        if flag not in known_here:
            problems.append(f"line {n}: {flag} is an option of no command this file names")
    return problems


_MISSING = object()


def _import(module: str, name: str):
    """`from module import name`, or _MISSING."""
    try:
        obj = getattr(importlib.import_module(module), name, _MISSING)
        return obj if obj is not _MISSING else importlib.import_module(f"{module}.{name}")
    except ImportError:
        return _MISSING


def python_problems(text: str) -> list[str]:
    """Python blocks that do not parse, and kernelwright names (imported, read as attributes,
    or called with keywords) that do not exist."""
    _, blocks = segments(text)
    problems: list[str] = []
    for n, source in blocks:
        try:
            tree = ast.parse(source)
        except SyntaxError as e:
            problems.append(f"python block at line {n}: does not parse: {e}")
            continue
        names: dict[str, object] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernelwright"):
                for a in node.names:
                    obj = _import(node.module, a.name)
                    if obj is _MISSING:
                        problems.append(f"python block at line {n}: no {node.module}.{a.name}")
                    names[a.asname or a.name] = obj
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != "kernelwright":
                        continue
                    if a.asname:  # import kernelwright.losses as L: L is the submodule
                        names[a.asname] = importlib.import_module(a.name)
                    else:  # import kernelwright[.losses]: the name bound is kernelwright
                        names["kernelwright"] = importlib.import_module("kernelwright")

        def resolve(node, _names=names):
            if isinstance(node, ast.Name):
                return _names.get(node.id)
            if isinstance(node, ast.Attribute):
                base = resolve(node.value)
                if inspect.ismodule(base) and base.__name__.startswith("kernelwright"):
                    return getattr(base, node.attr, _MISSING)
            return None

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and resolve(node) is _MISSING:
                problems.append(f"python block at line {n}: {ast.unparse(node)} does not exist")
            if isinstance(node, ast.Call) and callable(fn := resolve(node.func)):
                params = inspect.signature(fn).parameters
                if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                    continue
                problems += [
                    f"python block at line {n}: {ast.unparse(node.func)}() has no argument "
                    f"{k.arg!r}"
                    for k in node.keywords
                    if k.arg is not None and k.arg not in params
                ]
    return problems


def path_problems(text: str) -> list[str]:
    """Repository paths in code spans (src/..., docs/..., no placeholders) that do not exist."""
    shell, _ = segments(text)
    return [
        f"line {n}: {seg} does not exist"
        for n, seg in shell
        if REPO_PATH.match(seg) and not (ROOT / seg).exists() and not seg.startswith(WRITTEN_LATER)
    ]


# ----------------------------------------------------------------------------------- the skills


def test_the_skills_are_packaged_once():
    names = skills.names()
    assert set(WORKFLOWS) <= set(names), names
    assert "losses" in names
    # one source of truth: the package data, not a copy at the repository root
    assert not (ROOT / "skills").exists()
    assert "src/kernelwright/skills" in AGENTS.read_text()


@pytest.mark.parametrize("name", skills.names())
def test_front_matter(name):
    skill = skills.load(name)
    data = skills.front_matter(skill.text)
    assert data["name"] == name
    assert re.fullmatch(r"[a-z0-9-]{1,64}", name)
    assert isinstance(data["description"], str) and 40 <= len(data["description"]) <= 1024
    assert set(data) == {"name", "description"}, sorted(data)
    assert len(skill.text.splitlines()) <= 150  # concise: an agent reads all of it


@pytest.mark.parametrize("name", skills.names())
def test_every_command_flag_and_name_exists(name):
    text = skills.load(name).text
    assert cli_problems(text) == []
    assert python_problems(text) == []
    assert path_problems(text) == []


def test_agents_md_names_what_exists():
    text = AGENTS.read_text()
    assert cli_problems(text) == []
    assert path_problems(text) == []


def test_the_losses_skill_names_its_workflow_command():
    shell, _ = segments(skills.load("losses").text)
    assert any("kernelwright losses new" in seg for _, seg in shell)


def test_the_checker_fails_on_what_does_not_exist():
    text = skills.load("create").text
    planted = text + (
        "\n```bash\nkernelwright create ref.py --yes --no-such-flag\n"
        "kernelwright frobnicate all\n"
        "kernelwright results frob --db x.db\n"
        "kernelwright optimize rms_norm --dry-run && pytest --dist loadfile\n```\n"
        "Then `kernelwright bench rms_norm --quick --bogus` and `--made-up`.\n"
    )
    problems = "\n".join(cli_problems(planted))
    for bad in ("--no-such-flag", "frobnicate", "results frob", "--bogus", "--made-up"):
        assert bad in problems, (bad, problems)
    # flags of another program on the same line, and real ones, are not problems
    assert "--dist" not in problems and "--dry-run" not in problems and "--yes" not in problems
    assert len(cli_problems(planted)) == 5

    python = (
        "```python\nimport kernelwright as kw\nfrom kernelwright.losses import dpo_loss, nope\n"
        "from kernelwright.no_such_module import x\n"
        "kw.not_there(1)\ndpo_loss(a, b, betta=0.1)\n```\n"
    )
    problems = "\n".join(python_problems(python))
    assert "nope" in problems and "not_there" in problems and "'betta'" in problems
    assert "no_such_module" in problems
    assert python_problems("```python\ndef broken(:\n```\n")


def test_a_planted_flag_in_a_skill_file_fails(tmp_path):
    skill = tmp_path / "create" / "SKILL.md"
    skill.parent.mkdir()
    text = skills.load("create").text.replace("--from-profile", "--from-profil", 1)
    skill.write_text(text)
    assert any("--from-profil" in p for p in cli_problems(skill.read_text()))


# -------------------------------------------------------------------------------- the commands


def test_skills_list_prints_every_skill():
    result = CliRunner().invoke(app, ["skills", "list"])
    assert result.exit_code == 0, result.output
    for name in skills.names():
        assert name in result.output


def test_skills_install(tmp_path):
    runner = CliRunner()
    target = tmp_path / "agent" / "skills"
    result = runner.invoke(app, ["skills", "install", "--target", str(target)])
    assert result.exit_code == 0, result.output
    for name in skills.names():
        for rel, data in skills.skill_files(name):
            assert (target / name / rel).read_bytes() == data
        assert f"{name}: installed in" in result.output
    assert runner.invoke(app, ["skills", "install", "--target", str(target)]).exit_code == 0

    edited = target / "create" / "SKILL.md"
    edited.write_text(edited.read_text() + "\nmy note\n")
    mine = edited.read_text()
    (target / "optimize" / "SKILL.md").unlink()  # a missing file is no conflict
    result = runner.invoke(app, ["skills", "install", "--target", str(target)])
    assert result.exit_code == 1, result.output
    assert "--force" in result.output and "create" in result.output
    assert edited.read_text() == mine  # nothing was written
    assert not (target / "optimize" / "SKILL.md").exists()

    result = runner.invoke(app, ["skills", "install", "--target", str(target), "--force"])
    assert result.exit_code == 0, result.output
    assert "create: updated" in result.output and "optimize: installed" in result.output
    assert edited.read_text() == skills.load("create").text


def test_skills_install_default_target_and_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(app, ["skills", "install", "losses"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in (tmp_path / ".claude" / "skills").iterdir()] == ["losses"]
    assert runner.invoke(app, ["skills", "install", "no-such-skill"]).exit_code == 2
