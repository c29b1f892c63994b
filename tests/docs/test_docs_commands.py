"""Every ```sh block of the README, docs/python.md, docs/service.md and
docs/tuning.md runs as written, each one test case: a recipe a user pastes
must work.

The package is the Bazel-built wheel installed into a fresh venv (made with
--system-site-packages, so it sees the host's torch), first on PATH: the
docs' `knapformer` and `python3` are that install's. Two spellings stand for
it: `/opt/kf/bin/python3` (the README's venv) and `bash scripts/knapformer`
(a checkout's route to the same //tools:knapformer binary; Bazel cannot run
inside a Bazel test, and knapformer_script_test proves the script).

The blocks of one document run in order in one working folder, so a recipe
may go on from the block before it; it holds a copy of examples/ and two
files that stand for the user's own: mine.txt (a lengths file) and
request.json (docs/cli.md's example request). Processes a block leaves
running (a planner started with `&`) are stopped when it ends.

A block that cannot run here as written (a GPU, a network, the whole CI)
is shortened by the HTML comments just above its fence:

    <!-- docs-test sed: 1,2d -->            a sed script applied to the block
    <!-- docs-test why: the reason; tests/python/pip_install_check.sh runs that -->

A shortened block must say why, and every repository path the reason names
(the test that runs the cut part) must exist; a block cut whole is skipped,
its reason the skip's.
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

RUNFILES = os.path.join(os.environ["TEST_SRCDIR"], os.environ["TEST_WORKSPACE"])
DOCUMENTS = ["README.md", "docs/python.md", "docs/service.md", "docs/tuning.md"]
BLOCK_TIMEOUT_S = 300
# The checkout the runfiles link to (the reasons name its files: .ci/run too).
SOURCE_TREE = os.path.dirname(os.path.realpath(os.path.join(RUNFILES, "README.md")))
MARKER = re.compile(r"^<!-- docs-test (sed|why): (.*) -->$")


def blocks_of(document):
    """(first line number, commands, sed script, why) of each ```sh block."""
    lines = open(os.path.join(RUNFILES, document)).read().split("\n")
    found = []
    for number, line in enumerate(lines):
        if line != "```sh":
            continue
        end = lines.index("```", number + 1)
        marks = {}
        above = number - 1
        while above >= 0 and MARKER.match(lines[above]):
            kind, text = MARKER.match(lines[above]).groups()
            assert kind not in marks, f"{document}:{above + 1}: a second '{kind}' marker"
            marks[kind] = text
            above -= 1
        found.append((number + 1, "\n".join(lines[number + 1:end]), marks.get("sed"),
                      marks.get("why")))
    return found


CASES = [(document, *block) for document in DOCUMENTS for block in blocks_of(document)]


def test_every_document_has_blocks():
    for document in DOCUMENTS:
        assert any(case[0] == document for case in CASES), f"no ```sh block in {document}"


@pytest.fixture(scope="session")
def venv(tmp_path_factory):
    """The wheel, pip-installed into a fresh venv that sees the host's torch."""
    where = tmp_path_factory.mktemp("venv")
    wheel = os.path.join(RUNFILES, os.environ["DOCS_TEST_WHEEL"])
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(where)],
                   check=True)
    subprocess.run([str(where / "bin" / "python3"), "-m", "pip", "install", "--quiet",
                    "--no-index", "--no-deps", wheel], check=True)
    return where


FOLDERS = {}


def folder_for(document, tmp_path_factory):
    """The working folder of one document's blocks, made with its first."""
    if document not in FOLDERS:
        folder = tmp_path_factory.mktemp(document.replace("/", "_"))
        shutil.copytree(os.path.join(RUNFILES, "examples"), folder / "examples")
        rng = random.Random(7)  # a user's lengths: captions to video, some masked
        with open(folder / "mine.txt", "w") as out:
            out.write("# tokens[,mask]\n")
            for _ in range(600):
                tokens = rng.choice([rng.randint(16, 300), rng.randint(256, 1100),
                                     rng.randint(4000, 4200), rng.randint(16000, 17000)])
                out.write(f"{tokens},causal\n" if rng.random() < 0.25 else f"{tokens}\n")
        cli = open(os.path.join(RUNFILES, "docs/cli.md")).read()
        request = re.search(r"```json\n(\{\"topology\".*?)\n```", cli, re.S)
        assert request, "docs/cli.md lost its example request"
        (folder / "request.json").write_text(request.group(1) + "\n")
        FOLDERS[document] = folder
    return FOLDERS[document]


def stop_group(group):
    """SIGTERM to a block's process group, then SIGKILL to what is left after
    5 s (a planner answers its calls in flight, then exits)."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        for _ in range(int(wait_s / 0.1)):
            time.sleep(0.1)
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return


def as_run_here(commands, sed):
    if sed is not None:
        commands = subprocess.run(["sed", "-e", sed], input=commands, capture_output=True,
                                  text=True, check=True).stdout
    return commands.replace("/opt/kf/bin/python3", "python3").replace(
        "bash scripts/knapformer", "knapformer")


@pytest.mark.parametrize("document,line,commands,sed,why", CASES,
                         ids=[f"{case[0]}:{case[1]}" for case in CASES])
def test_block_runs(document, line, commands, sed, why, venv, tmp_path_factory):
    if sed is not None:
        assert why, f"{document}:{line}: a shortened block says why (docs-test why:)"
    for path in re.findall(r"[\w.-]+/[\w./-]+\.(?:sh|py|cc|md)\b", why or ""):
        assert os.path.exists(os.path.join(SOURCE_TREE, path)), \
            f"{document}:{line}: the reason names {path}, which does not exist"
    script = as_run_here(commands, sed)
    if not script.strip():
        pytest.skip(f"{document}:{line}: cut whole: {why}")
    folder = folder_for(document, tmp_path_factory)
    env = dict(os.environ, PATH=f"{venv / 'bin'}:{os.environ['PATH']}",
               VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)  # the venv's knapformer, not the runfiles'
    # Output to a file, not a pipe: a planner left in the background holds
    # a pipe open past the block's end.
    log = folder / f"block-{line}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=folder,
                                   env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            process.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            pytest.fail(f"{document}:{line} ran past {BLOCK_TIMEOUT_S} s:\n{script}\n"
                        f"{log.read_text()}")
        finally:
            stop_group(process.pid)  # what the block left running (a planner started with &)
    output = log.read_text()
    print(f"$ {script}\n{output}")
    assert process.returncode == 0, \
        f"{document}:{line} exited {process.returncode}:\n{script}\n--- output\n{output}"
