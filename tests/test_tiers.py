"""The tiers of tests (``support/tiers.py``): each test lands in its tier by its fixtures or
marks, a unit test that starts a process fails, and so does a skipped test.

Each case is a small test file run by pytest in this process (``pytester``), with the tiers'
plugin and the markers as setup.cfg registers them.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

SETUP_CFG = Path(__file__).resolve().parent.parent / "setup.cfg"


@pytest.fixture
def run(pytester: pytest.Pytester):
    """Run pytest in this process on ``source`` (a test file), with the tiers' plugin."""
    ini = configparser.ConfigParser()
    ini.read(SETUP_CFG)
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    "
                     + "\n    ".join(ini["tool:pytest"]["markers"].strip().splitlines()))

    def run(source: str, *args: str) -> pytest.RunResult:
        pytester.makepyfile(test_case=source)
        return pytester.runpytest_inprocess("-p", "support.tiers", "-p", "no:cacheprovider",
                                            "-p", "no:hypothesispytest", *args)
    return run


CASES = '''
import pytest

@pytest.fixture
def cluster():
    return "a cluster"

@pytest.fixture
def spark(cluster):
    return "a session"

@pytest.fixture
def browser():
    return "a browser"

def test_pure():
    pass

def test_on_a_cluster(cluster):
    pass

def test_on_spark(spark):
    pass

def test_in_a_browser(browser):
    pass

@pytest.mark.root
def test_as_root():
    pass
'''


@pytest.mark.parametrize("tier, chosen", [
    ("unit", ["test_pure"]),
    ("cluster", ["test_on_a_cluster", "test_on_spark"]),  # spark's fixture asks for a cluster
    ("spark", ["test_on_spark"]),
    ("browser", ["test_in_a_browser"]),
    ("root", ["test_as_root"]),
    ("not unit", ["test_on_a_cluster", "test_on_spark", "test_in_a_browser", "test_as_root"]),
])
def test_a_test_lands_in_its_tier_by_its_fixtures_or_marks(run, tier, chosen):
    result = run(CASES, "-m", tier, "--collect-only", "-q")
    assert result.ret == 0
    assert [line.split("::")[1] for line in result.outlines if "::" in line] == chosen


def test_a_module_mark_puts_every_test_of_the_file_in_its_tier(run):
    result = run("import pytest\npytestmark = pytest.mark.cluster\n"
                 "def test_one():\n    pass\n", "-m", "unit")
    result.assert_outcomes()  # deselected, nothing run
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.mark.parametrize("start", [
    "subprocess.run(['true'])",
    "subprocess.Popen(['true']).wait()",
    "os.system('true')",
    "multiprocessing.get_context('fork').Process(target=print).start()",
    "multiprocessing.get_context('spawn').Process(target=print).start()",
], ids=["subprocess.run", "Popen", "os.system", "multiprocessing fork", "multiprocessing spawn"])
def test_a_unit_test_that_starts_a_process_fails_naming_it(run, start):
    result = run(f"import multiprocessing, os, subprocess\n"
                 f"def test_starts():\n    {start}\n")
    result.assert_outcomes(failed=1)
    assert "a unit test started a process" in result.stdout.str()


def test_a_unit_test_that_hides_the_process_it_tried_to_start_fails_all_the_same(run):
    result = run("import subprocess\n"
                 "def test_starts_quietly():\n"
                 "    try:\n"
                 "        subprocess.run(['true'])\n"
                 "    except Exception:\n"
                 "        pass\n")
    result.assert_outcomes(failed=1)
    assert "is a unit test" in result.stdout.str() and "['true']" in result.stdout.str()


@pytest.mark.cluster  # its case starts a process: this test does too
def test_a_test_in_another_tier_may_start_processes(run):
    result = run("import subprocess, pytest\n"
                 "@pytest.mark.cluster\n"
                 "def test_starts():\n"
                 "    assert subprocess.run(['true']).returncode == 0\n")
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("source", [
    "import pytest\ndef test_skips():\n    pytest.skip('no Java here')\n",
    "import pytest\n@pytest.mark.skip(reason='no Java here')\ndef test_skipped():\n    pass\n",
    "import pytest\n@pytest.mark.skipif(True, reason='no Java here')\n"
    "def test_skipped():\n    pass\n",
    "import pytest\n@pytest.fixture\ndef java():\n    pytest.skip('no Java here')\n"
    "def test_needs(java):\n    pass\n",
], ids=["pytest.skip", "mark.skip", "mark.skipif", "a fixture's skip"])
def test_a_skipped_test_fails_the_run_saying_why(run, source):
    result = run(source)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) + outcomes.get("errors", 0) == 1 and "skipped" not in outcomes
    assert "no Java here" in result.stdout.str() and "allows no skip" in result.stdout.str()


def test_a_module_that_skips_itself_fails_the_run(run):
    result = run("import pytest\npytest.skip('no Java here', allow_module_level=True)\n"
                 "def test_never():\n    pass\n")
    assert result.ret != 0
    assert "no Java here" in result.stdout.str() and "allows no skip" in result.stdout.str()


def test_a_strict_xfail_stays_an_expected_failure(run):
    result = run("import pytest\n@pytest.mark.xfail(strict=True, reason='known')\n"
                 "def test_known():\n    assert False\n")
    result.assert_outcomes(xfailed=1)
    assert result.ret == 0
