"""The status page as users get it: the real ``blizzard dashboard`` command, and the page in
a real headless Chromium against a real cluster, updating without a reload."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from blizzard import Client
from blizzard.local.harness import free_port

from support.http_get import get
from support.processes import stop
from support.wait import wait_for

pytestmark = pytest.mark.cluster  # the real command, in processes of its own

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


# -- the real command, and the page in a real browser ---------------------------------------

def start_dashboard(master: str, port: int, env: dict[str, str], tmp_path,
                    *options: str) -> subprocess.Popen:
    log = open(tmp_path / "dashboard.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "dashboard", "--master", master,
                             "--port", str(port), "--interval-s", "0.5", "--timeout-s", "0.5",
                             *options], stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
        try:
            return get(url + "/api/state")[0] == 200
        except OSError:
            return False
    wait_for(answers, what="the dashboard to listen")
    return proc




def test_the_command_serves_an_insecure_cluster(cluster_factory, tmp_path):
    c = cluster_factory(datanodes=1, replication=1, keys=None)
    env = {k: v for k, v in os.environ.items() if k != "BLIZZARD_KEYS"}
    with Client(c.master_addr, keys="") as client:
        client.enqueue_many("plain", [b"a", b"b"])
    port = free_port()
    proc = start_dashboard(c.master_addr, port, env, tmp_path, "--allow-host", "dash.example",
                           "--allow-host", "other.example")
    try:
        doc = wait_for(lambda: (d := json.loads(get(f"http://127.0.0.1:{port}/api/state")[2]))
                       ["queues"] and d, what="queues on the page")
        assert doc["cluster"]["secure"] is False and doc["queues"][0]["ready"] == 2
        for host, code in (("other.example", 200), (f"dash.example:{port}", 200),
                           (f"evil.example:{port}", 421)):
            assert get(f"http://127.0.0.1:{port}/api/state", headers={"Host": host})[0] == code
    finally:
        stop(proc)
    assert proc.returncode == 0


def test_a_port_in_use_or_a_bad_option_is_one_line_and_an_exit_code():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = subprocess.run([sys.executable, "-m", "blizzard.cli", "dashboard", "--port",
                               str(port)], capture_output=True, text=True, timeout=60)
    assert busy.returncode == 1 and busy.stderr.strip().count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    bad = subprocess.run([sys.executable, "-m", "blizzard.cli", "dashboard", "--interval-s", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--interval-s" in bad.stderr
    long = subprocess.run([sys.executable, "-m", "blizzard.cli", "dashboard", "--history-s",
                           "86400", "--interval-s", "0.2"], capture_output=True, text=True,
                          timeout=60)
    assert long.returncode == 2 and "more than 3600: sample every 24 s or more" in long.stderr


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        pytest.fail(f"the browser test needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install "
                    "chromium chromium-driver (scripts/test does it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1200,800", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_page_shows_a_queue_and_follows_it_without_a_reload(cluster, browser, tmp_path):
    from selenium.webdriver.support.ui import WebDriverWait

    def text(driver, selector: str) -> str:
        """The element's text now, read in one step (the page replaces its rows as it redraws)."""
        return driver.execute_script("const e = document.querySelector(arguments[0]);"
                                     "return e ? e.innerText : '';", selector)

    def ready_cell(driver) -> str:
        return text(driver, 'tr[data-queue="pages"] td[data-field="ready"]')

    # Given a queue with 5 items, one with a dead item in a dead-letter queue of its own name,
    # and the dashboard on them
    with Client(cluster.master_addr, admin=True) as client:
        client.create_queue("pages")
        client.enqueue_many("pages", [b"x"] * 5)
        client.create_queue("triage", dead_letter="graveyard", max_attempts=1)
        client.enqueue("triage", b"z")
        client.dequeue("triage").nack(delay_s=0, error="ValueError")
        client.schedule("nightly", "reports", b"report", every_s=3600)
        client.enqueue("crunch", b"job")
        running = client.dequeue("crunch", lease_s=300)
        client.extend_many([running], lease_s=300, progress={running.id: (0.4, "step 2 of 5", b"")})
        proc = start_dashboard(cluster.master_addr, free_port(), dict(os.environ), tmp_path)
        try:
            # When the page loads, it shows the queue with its depth
            browser.get(f"http://127.0.0.1:{proc.args[proc.args.index('--port') + 1]}/")
            WebDriverWait(browser, 20, poll_frequency=0.1).until(lambda d: ready_cell(d) == "5")
            browser.execute_script("window.notReloaded = true")
            scheduled = text(browser, 'tr[data-schedule="nightly"]')
            assert "every 3600 s" in scheduled and "reports" in scheduled
            job = text(browser, f'tr[data-job="{running.id}"]')
            assert "40%" in job and "step 2 of 5" in job
            hint = text(browser, 'tr[data-dead="triage"] td.hint')
            assert hint.startswith("blizzard queue peek graveyard --n 10; ")  # its own setting
            # and after more items arrive, it shows the new depth by itself
            client.enqueue_many("pages", [b"y"] * 7)
            WebDriverWait(browser, 20, poll_frequency=0.1).until(lambda d: ready_cell(d) == "12")
            assert browser.execute_script("return window.notReloaded === true")
            health = text(browser, "#health")
            assert "3 alive, 0 dead" in health and "security\non" in health
            # When the master goes away, the page says so instead of failing
            cluster.master.kill()
            WebDriverWait(browser, 20, poll_frequency=0.1).until(
                lambda d: "master is unreachable" in text(d, "#banner"))
            assert ready_cell(browser) == "12"  # the last figures stay, marked stale
            # and when it is back, so is the page, by itself
            cluster.restart_master()
            WebDriverWait(browser, 20, poll_frequency=0.1).until(
                lambda d: d.execute_script("return document.getElementById('banner').hidden"))
            assert ready_cell(browser) == "12" and "master\nup" in text(browser, "#health")
        finally:
            stop(proc)
