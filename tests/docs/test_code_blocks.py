"""Every code block of the README and docs/*.md either runs here or says why not.

A fenced ``python`` block runs; so does a ``bash`` or ``console`` block, whose commands are
`kernels` CLI calls that work offline. Any other such block carries a visible reason on the
line just above its fence::

    <!-- not run: needs a CUDA GPU -->

so that a new block cannot slip through untested: `test_every_block_runs_or_says_why_not`
fails on an unmarked block that is not runnable here, and `test_page_blocks_run` runs the rest.
A block marked ``<!-- not run: an excerpt of PATH -->`` is compared with that file instead.

The blocks of one page run in order in one fresh process and one namespace, as a reader runs them
top to bottom (a later block may use an earlier block's imports). They run on the CPU with
``TRITON_INTERPRET=1`` (our kernels through Triton's interpreter) and ``HF_HUB_OFFLINE=1``
(nothing is downloaded), Python blocks in a fresh temporary folder, shell blocks in the
repository root (they name its folders, such as ``library/norm``). Where a page's code uses a
model it does not build, the namespace provides a tiny one, built only when the page's code
names it:

- ``model``: a randomly initialised 1-layer ``LlamaForCausalLM`` (hidden size 64),
- ``path``: the folder it was saved to with ``save_pretrained``,
- ``input_ids``, ``example_input_ids``, ``mask``: a batch of 2 x 8 tokens and its mask.

Run it as a script (``python test_code_blocks.py PAYLOAD.json``) and it is that subprocess;
``--serve`` makes it the one that forks a child for each page (`page_runner`).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import textwrap
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: The languages whose blocks are code to run (the rest, such as text, json and toml, show data).
LANGUAGES = {
    "python": "python",
    "bash": "shell",
    "console": "shell",
    "sh": "shell",
    "shell": "shell",
}
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(\S.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
#: Names the runner provides when a page's code uses them (see the module docstring).
PROVIDED = ("model", "path", "input_ids", "example_input_ids", "mask")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    kind: str  # "python" or "shell"
    code: str  # dedented
    not_run: str | None  # the marked reason, or None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The code blocks of `page` (python and shell), each with its not-run mark if any."""
    lines = page.read_text().splitlines()
    found = []
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        kind = LANGUAGES.get(fence.group(2))
        if kind:
            mark = NOT_RUN.match(lines[index - 1]) if index else None
            found.append(
                Block(
                    page=page.relative_to(REPO).as_posix(),
                    line=index + 1,
                    kind=kind,
                    code=textwrap.dedent("\n".join(lines[index + 1 : end])) + "\n",
                    not_run=mark.group(1) if mark else None,
                )
            )
        index = end + 1
    return found


def runnable_shell(block: Block) -> str | None:
    """Why a shell block cannot run as it stands, or None: only `kernels` commands run."""
    for line in block.code.splitlines():
        command = line.split("#", 1)[0].strip().removeprefix("$ ")
        if command and not command.startswith("kernels "):
            return f"runs {command.split()[0]!r}, not a `kernels` command"
    return None


def test_every_block_runs_or_says_why_not():
    unmarked = []
    for page in PAGES:
        for block in blocks(page):
            if block.not_run is None and block.kind == "shell" and runnable_shell(block):
                unmarked.append(f"{block.where}: {runnable_shell(block)}")
    assert not unmarked, (
        "shell blocks that cannot run here need a reason just above the fence, "
        "e.g. <!-- not run: needs a CUDA GPU -->:\n" + "\n".join(unmarked)
    )


def test_dry_run_uploads_are_run_not_excused():
    """`kernels upload --dry-run` checks and lists offline, so no page may excuse a block of it
    as needing the Hub: such a block runs here, which is the proof that it needs none."""
    excused = [
        f"{block.where}: {block.not_run}"
        for page in PAGES
        for block in blocks(page)
        if block.not_run is not None and "--dry-run" in block.code
    ]
    assert not excused, "blocks with --dry-run marked not run:\n" + "\n".join(excused)


def test_the_marks_sit_on_code_blocks():
    """A not-run mark is above a python or shell fence, so it excuses the block it names."""
    stray = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines[:-1], start=1):
            if NOT_RUN.match(line):
                fence = FENCE.match(lines[number])
                if not (fence and fence.group(2) in LANGUAGES):
                    stray.append(f"{page.relative_to(REPO)}:{number}")
    assert not stray, "not-run marks that are not just above a code block: " + ", ".join(stray)


def test_excerpts_match_their_source():
    """A block marked ``an excerpt of PATH`` shows lines that PATH has (indentation aside), so a
    renamed function or a changed signature in the source fails here until the guide follows."""
    stale = []
    for page in PAGES:
        for block in blocks(page):
            excerpt = re.fullmatch(r"an excerpt of (\S+)", block.not_run or "")
            if not excerpt:
                continue
            source = REPO / excerpt.group(1)
            assert source.is_file(), f"{block.where}: {source} does not exist"
            lines = {line.strip() for line in source.read_text().splitlines()}
            stale += [
                f"{block.where}: {line.strip()!r} is not in {excerpt.group(1)}"
                for line in block.code.splitlines()
                if line.strip() and line.strip() not in lines
            ]
    assert not stale, "excerpts that no longer match their source:\n" + "\n".join(stale)


def test_every_docs_page_is_listed_in_the_readme():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^- \[docs/([\w.-]+\.md)\]\(docs/\1\)", section, re.MULTILINE))
    pages = {page.name for page in (REPO / "docs").glob("*.md")}
    assert pages - listed == set(), "docs pages missing from the README's Documentation list"


def _page_environment() -> dict[str, str]:
    return {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # `kernels` on PATH is this interpreter's, as in the environment the reader installed.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.fixture(scope="module")
def page_runner():
    """A Python started with the pages' environment that imports torch, transformers and
    kernels once, then forks a child for each page: a forked child is a freshly started Python
    that has run those imports (no page's code has run in its parent), and the imports were
    most of each page's seconds. Where ``os.fork`` is missing, each page starts its own."""
    if not hasattr(os, "fork"):
        yield None
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        cwd=REPO,
        env=_page_environment(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    yield server
    server.stdin.close()
    server.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(b.not_run is None for b in blocks(page))],
    ids=lambda page: page.name,
)
def test_page_blocks_run(page, tmp_path, page_runner):
    to_run = [asdict(b) for b in blocks(page) if b.not_run is None]
    payload = tmp_path / "blocks.json"
    payload.write_text(json.dumps(to_run))
    workdir = tmp_path / "work"
    workdir.mkdir()
    if page_runner is None:
        run = subprocess.run(
            [sys.executable, __file__, str(payload)],
            cwd=workdir,
            env=_page_environment(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        returncode, output = run.returncode, run.stdout + run.stderr
    else:
        log = tmp_path / "output.txt"
        page_runner.stdin.write(f"{payload}\t{workdir}\t{log}\n")
        page_runner.stdin.flush()
        ready, _, _ = select.select([page_runner.stdout], [], [], 900)
        assert ready, f"{page.name}: no answer from the page runner in 900 s"
        reply = page_runner.stdout.readline()
        assert reply, f"{page.name}: the page runner exited ({page_runner.poll()})"
        returncode, output = int(reply), log.read_text() if log.exists() else ""
    assert returncode == 0, f"{page.name}: a code block failed\n{output}"


# The subprocess: run one page's blocks in order.


def _provide(namespace: dict, workdir: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
    )
    model = LlamaForCausalLM(config)
    path = workdir / "tiny-llama"
    model.save_pretrained(path)
    input_ids = torch.randint(0, config.vocab_size, (2, 8))
    namespace.update(
        model=model,
        path=str(path),
        input_ids=input_ids,
        example_input_ids=input_ids,
        mask=torch.ones_like(input_ids),
    )


def _run_page(payload: Path) -> int:
    to_run = [Block(**entry) for entry in json.loads(payload.read_text())]
    namespace: dict = {"__name__": "__main__"}
    python = "\n".join(b.code for b in to_run if b.kind == "python")
    if any(re.search(rf"\b{name}\b", python) for name in PROVIDED):
        _provide(namespace, Path.cwd())
    for block in to_run:
        print(f"--- {block.where} ({block.kind})", flush=True)
        try:
            if block.kind == "python":
                exec(compile(block.code, block.where, "exec"), namespace)
            else:
                subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=REPO, check=True)
        except BaseException:
            traceback.print_exc()
            print(f"FAILED: the block at {block.where}", flush=True)
            return 1
    return 0


def _serve() -> int:
    """`page_runner`'s side: for each line ``PAYLOAD<TAB>WORKDIR<TAB>LOG`` on stdin, a forked
    child runs the page in WORKDIR with its output in LOG; its exit status is the answer."""
    import torch  # noqa: F401 - the imports the pages make, made once
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401

    import kernels  # noqa: F401
    import kernels.library  # noqa: F401

    for line in sys.stdin:
        payload, workdir, log = line.rstrip("\n").split("\t")
        sys.stdout.flush()
        child = os.fork()
        if child == 0:
            returncode = 1
            try:
                output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(output, 1)
                os.dup2(output, 2)
                os.chdir(workdir)
                returncode = _run_page(Path(payload))
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(returncode)
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_serve() if sys.argv[1] == "--serve" else _run_page(Path(sys.argv[1])))
