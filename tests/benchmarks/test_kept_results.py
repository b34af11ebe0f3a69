"""benchmarks/results/: one folder per command per device holding its latest run, and the pages
that show it (benchmarks/README.md, each device's NOTES.md, the model cards) true to those files:
every table they show renders from the kept results, every relative link resolves."""

import json
import re
from pathlib import Path

from benchmarks import ops

# ---- the kept results: what the README and the model cards show comes from them -------------

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


def _results(folder: Path) -> list:
    return json.loads((folder / "results.json").read_text())["results"]


def _table_rows(text: str) -> list:
    """The body rows of the markdown tables in ``text`` (no header or separator lines)."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [line for line in lines if not line.startswith(("| shape |", "| op |", "| contender |"))]


def rendered_columns(lines: set[str]) -> int:
    """The number of ``|`` in the rows of a rendered table (its header's)."""
    return max((line.count("|") for line in lines), default=0)


def test_model_cards_render_from_the_kept_results():
    """Every benchmark row of a model card is a row ``python -m benchmarks.ops --card`` prints
    from the results folder the card names: moving or re-running results cannot leave a card
    behind."""
    from benchmarks import loss

    for card in sorted((ROOT / "library").glob("*/README.md")):
        text = card.read_text()
        _, found, benchmarks = text.partition("\n## Benchmarks\n")
        assert found, f"{card} has no Benchmarks section (say there when nothing is measured yet)"
        if not _table_rows(benchmarks.split("\n## ")[0]):
            continue  # nothing measured by a benchmarks/ command yet; the section says so
        match = re.search(
            r"python -m benchmarks\.(ops|loss)\s+--card\s+--out\s+(benchmarks/results/\S+?)`", text
        )
        assert match, f"{card} does not name the results its tables come from"
        command, folder = match.groups()
        if command == "loss":  # the fused loss's card: loss.py's table of its own results
            with open(ROOT / folder / "results.json") as f:
                rendered = set(loss.card_table(json.load(f)["results"]).splitlines())
            rows = [
                row
                for row in _table_rows(text)
                if re.match(r"\| \d+ x \d+ -> \d+", row)
                and "GiB" not in row
                and row.count("|") == rendered_columns(rendered)
            ]
            assert rows, f"{card} has no benchmark table"
            assert [row for row in rows if row not in rendered] == []
            continue
        results = _results(ROOT / folder)
        rendered = {
            line for op in dict.fromkeys(r["op"] for r in results)
            for line in ops.card_tables(results, op).splitlines()
        }  # fmt: skip
        rows = [row for row in _table_rows(text) if re.match(r"\| \d+x\d+", row)]
        assert rows, f"{card} has no benchmark table"
        assert [row for row in rows if row not in rendered] == []


def test_readme_shows_each_devices_latest_results():
    """benchmarks/README.md's ops tables are ``python -m benchmarks.ops --summary`` of each
    device's kept ops run, and each e2e table it shows is one of the kept e2e results'."""
    readme = (BENCHMARKS / "README.md").read_text()
    devices = sorted(p.name for p in (BENCHMARKS / "results").iterdir() if p.is_dir())
    assert devices == ["h100", "h200"]
    for device in devices:
        folder = BENCHMARKS / "results" / device
        assert (folder / "NOTES.md").is_file()
        table = ops.summary_table(_results(folder / "ops"), f"results/{device}/ops")
        assert table in readme, f"README's {device} table differs from benchmarks.ops --summary"
    kept = (BENCHMARKS / "results" / "h100" / "e2e" / "results.md").read_text()
    shown = [block for block in readme.split("\n\n") if block.startswith("| contender | train")]
    assert shown, "README shows no end-to-end table"
    for table in shown:
        assert table in kept, "README's end-to-end table differs from results/h100/e2e/results.md"


# The files a command's results folder may hold: its latest run's results and tables, plots,
# and decode_mlp's sweep. Logs, probe outputs and GPU test logs are not results.
RESULT_FILES = re.compile(r"(results|sweep)\.(json|md)|profile_v\d+_\d+x\d+\.json|[\w.-]+\.png")


def test_each_command_folder_holds_its_latest_results_only():
    """results/<device>/ holds NOTES.md and one folder per command (a command of this package),
    each with results.json and results.md and nothing but results, and the README links each
    folder's results.md."""
    readme = (BENCHMARKS / "README.md").read_text()
    commands = {p.stem for p in BENCHMARKS.glob("*.py")} - {
        "__init__",
        "cases",
        "timing",
        "profiling",
        "results_io",
    }
    for device in sorted(p for p in (BENCHMARKS / "results").iterdir() if p.is_dir()):
        for entry in sorted(device.iterdir()):
            if entry.is_file():
                assert entry.name == "NOTES.md", f"{entry}: only NOTES.md beside the folders"
                continue
            assert entry.name in commands, f"{entry}: not a command's folder ({sorted(commands)})"
            names = {p.name for p in entry.iterdir()}
            assert {"results.json", "results.md"} <= names, f"{entry} lacks its results"
            others = sorted(n for n in names if not RESULT_FILES.fullmatch(n))
            assert others == [], f"{entry} holds files that are not results: {others}"
            link = f"(results/{device.name}/{entry.name}/results.md)"
            assert link in readme, f"benchmarks/README.md does not link {link}"


def test_benchmark_pages_link_to_what_exists():
    """Relative links of the benchmark pages and the pages that cite them resolve, anchors into
    a results.md included."""
    pages = [BENCHMARKS / "README.md", *sorted((BENCHMARKS / "results").glob("*/NOTES.md"))]
    pages += [
        *sorted((ROOT / "library").glob("*/README.md")),
        *sorted((ROOT / "docs").glob("*.md")),
    ]
    broken = []
    for page in pages:
        # Code is not a link: ``kernel[grid](...)`` in a code span is not one.
        text = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", page.read_text(), flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith("#"):
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and resolved.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
