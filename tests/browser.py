"""Headless Chromium for the HTML reports' tests: opens a file, collects the console's errors and
every network request, and takes a full-page screenshot. `chromium()` says why it cannot run, if so."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
DRIVER = "/usr/bin/chromedriver"
WIDTH = 1280


@dataclass
class Opened:
    """What the browser saw of one page."""

    errors: list[str]  # console errors and uncaught exceptions
    requests: list[str]  # every URL the page asked for
    text: str  # the page's visible text
    figures: int  # plotly figures drawn (each has an SVG main layer)


def chromium() -> tuple[str | None, str]:
    """(path of a usable Chromium, "") or (None, why not)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return None, "selenium is not installed (pip install selenium; it is in the test extra)"
    binary = next((b for b in CHROMIUM if Path(b).exists()), None) or shutil.which("chromium")
    if binary is None or not Path(DRIVER).exists():
        return None, "chromium and chromedriver are not installed (apt-get install -y chromium chromium-driver)"
    try:
        subprocess.run([binary, "--version"], capture_output=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{binary} does not start: {err}"
    return binary, ""


def driver(binary: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WIDTH},900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))


def open_page(browser, path: Path, screenshot: Path) -> Opened:
    """Loads `path`, waits for its figures, and saves a full-page PNG at `screenshot`."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get_log("browser"), browser.get_log("performance")  # this page's entries only
    browser.get(path.resolve().as_uri())
    WebDriverWait(browser, 20).until(lambda b: b.execute_script("return document.readyState") == "complete")
    expected = browser.execute_script("return document.querySelectorAll('.plotly-graph-div').length")
    WebDriverWait(browser, 20).until(
        lambda b: b.execute_script("return document.querySelectorAll('.plotly-graph-div .main-svg').length") >= expected
    )
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    import base64

    screenshot.write_bytes(base64.b64decode(shot["data"]))
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    requests = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            requests.append(message["params"]["request"]["url"])
    figures = browser.execute_script("return document.querySelectorAll('.plotly-graph-div .main-svg').length")
    return Opened(errors, requests, browser.find_element("tag name", "body").text, figures)
