"""Make docs/dashboard.png: a local cluster with a few queues and a minute of traffic, its
status page in headless Chromium (from the OS packages), saved at 1200x800.

Run: PYTHONPATH=. .venv/bin/python scripts/dashboard_screenshot.py [OUT.png]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from blizzard import Client
from blizzard.local.harness import LocalCluster, free_port

TRAFFIC_S = 60.0
STEP_S = 0.5


def traffic(client: Client, started: float) -> None:
    """One step: steady e-mails, a burst of thumbnails draining, webhooks that fail."""
    elapsed = time.monotonic() - started
    client.enqueue_many("emails", [b"mail"] * 12)
    for m in client.dequeue_many("emails", 9):
        m.ack()
    if elapsed < 15:
        client.enqueue_many("thumbnails", [b"img"] * 60)
    for m in client.dequeue_many("thumbnails", 12):
        m.ack()
    client.enqueue_many("webhooks", [b"post"] * 3)
    for i, m in enumerate(client.dequeue_many("webhooks", 3)):
        if i == 0:
            m.nack(error="HTTP 503 from the receiver")
        else:
            m.ack()
    if int(elapsed / STEP_S) % 10 == 0:
        client.enqueue_many("reports", [b"pdf"] * 5, delay_s=3600)


def main(out: str) -> None:
    base = tempfile.mkdtemp(prefix="blizzard-shot-")
    with LocalCluster(base, datanodes=3, replication=2, heartbeat_s=0.5) as cluster, \
            Client(cluster.master_addr, admin=True) as client:
        client.create_queue("webhooks", max_attempts=1)
        port = free_port()
        dash = subprocess.Popen([sys.executable, "-m", "blizzard.cli", "dashboard", "--master",
                                 cluster.master_addr, "--port", str(port), "--interval-s", "1"],
                                env=dict(os.environ))
        try:
            started = time.monotonic()
            while time.monotonic() - started < TRAFFIC_S:
                traffic(client, started)
                time.sleep(STEP_S)
            shoot(f"http://127.0.0.1:{port}/", out, base)
        finally:
            dash.terminate()
            dash.wait(10)


def shoot(url: str, out: str, base: str) -> None:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,800",
                 "--hide-scrollbars", f"--user-data-dir={os.path.join(base, 'chromium')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(url)
        time.sleep(3)  # two refreshes: the page has drawn its charts
        driver.save_screenshot(out)
    finally:
        driver.quit()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png")
