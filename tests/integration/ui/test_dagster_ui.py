"""What a person sees: `tp demo`, then the platform server's UI on loopback, opened in headless Chromium.

Asserts the asset graph shows the five assets, that the training_run materialization shows cost,
utilization, the alert checks and the loss-curve plot (rendered as an image), and that the runs page
shows the run with its team. Screenshots
go to test-artifacts/ui/ (or $TP_TEST_ARTIFACTS/ui/).

Needs Debian's `chromium` and `chromium-driver`; as root the test installs them with apt-get,
otherwise (or when that fails) it skips and says why.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from training_platform.identifiers import PLATFORM_USER

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Flags for a sandboxed machine with no network but loopback (see the machine notes).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1100",
]
ASSETS = ["dataset_snapshot", "training_run", "checkpoints", "evaluated_model", "registered_model"]
WAIT_S = 180
COMMUNITY_DIALOG = "Join the Dagster community"


def _install_chromium() -> str | None:
    """None when Chromium and its driver are there (installing them as root); else why not."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return "not root or no apt-get: install them with `apt-get install -y chromium chromium-driver`"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"]):
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return f"`{' '.join(command)}` failed: {proc.stderr.strip()[-500:]}"
    return None if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists() else "apt-get ran but no chromium appeared"


@pytest.fixture(scope="module")
def artifacts() -> Path:
    path = Path(os.environ.get("TP_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "ui"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory, platform, ui):
    """Headless Chromium, signed in to the UI with the server's token (the session cookie stays for the module)."""
    problem = _install_chromium()
    if problem:
        pytest.skip(f"BROWSER TEST NOT RUN: Debian chromium + chromium-driver unavailable ({problem})")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    _sign_in(driver, f"{ui}/runs", platform.token)
    yield driver
    driver.quit()


def _sign_in(driver, url: str, token: str, wrong_first: bool = False) -> None:
    """Open URL, which the server answers with its sign-in page, and sign in with TOKEN (after a wrong one, when
    `wrong_first`, which must be refused on the page); then the browser is where it was going."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(lambda d: "/signin" in d.current_url)
    if wrong_first:
        driver.find_element(By.ID, "token").send_keys("tp_not-a-token-of-this-server")
        driver.find_element(By.ID, "token").submit()
        WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
            lambda d: "not valid" in d.find_element(By.TAG_NAME, "body").text
        )
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.ID, "token").submit()
    WebDriverWait(driver, WAIT_S, poll_frequency=0.5).until(
        lambda d: d.current_url.startswith(url) and "/signin" not in d.current_url
    )


@pytest.fixture(scope="module")
def ui(platform, demo) -> str:
    """The platform server's own UI: what `make ui` opens, where `tp demo` ran."""
    return platform.url


def _open(driver, url: str, must_show: list[str]) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)

    def shown(d) -> str | bool:
        _no_community_dialog(d)
        text = d.find_element(By.TAG_NAME, "body").text
        return text if all(word in text for word in must_show) else False

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=1).until(shown)
    except Exception:
        text = driver.find_element(By.TAG_NAME, "body").text
        missing = [w for w in must_show if w not in text]
        pytest.fail(f"{url} never showed {missing}; the page shows:\n{text[:2000]}")


def _no_community_dialog(driver) -> None:
    """The shipped instance turns Dagster's onboarding off (deploy/dagster/dagster.yaml, `nux`): its dialog, which
    asks for an e-mail address, never covers the platform's UI."""
    from selenium.webdriver.common.by import By

    if COMMUNITY_DIALOG in driver.find_element(By.TAG_NAME, "body").text:
        pytest.fail(f"Dagster's '{COMMUNITY_DIALOG}' dialog covers {driver.current_url}")


def _click(driver, find) -> None:
    """Click the element `find(driver)` returns once nothing covers it: a pop-up can open after the page has
    shown what `_open` waited for (seen: a dialog's backdrop took the click), and its content can re-render."""
    from selenium.common.exceptions import ElementClickInterceptedException, StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    def clicked(d) -> bool:
        _no_community_dialog(d)
        try:
            element = find(d)
            d.execute_script("arguments[0].scrollIntoView()", element)
            element.click()
        except (ElementClickInterceptedException, StaleElementReferenceException):
            ActionChains(d).send_keys(Keys.ESCAPE).perform()  # closes a dialog in the way
            return False
        return True

    WebDriverWait(driver, WAIT_S, poll_frequency=1).until(clicked)


def test_the_ui_asks_for_a_token_shows_who_signed_in_and_signs_out(browser, ui, platform, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.delete_all_cookies()  # a browser that never signed in here
    _sign_in(browser, f"{ui}/runs", platform.token, wrong_first=True)
    _open(browser, f"{ui}/runs", ["training_pipeline", f"signed in as {PLATFORM_USER}"])
    browser.save_screenshot(str(artifacts / "signed-in-runs.png"))
    _click(browser, lambda d: d.find_element(By.CSS_SELECTOR, "#tp-user button"))
    WebDriverWait(browser, WAIT_S, poll_frequency=0.5).until(lambda d: "/signin" in d.current_url)
    _sign_in(browser, f"{ui}/runs", platform.token)  # signed out: the UI asks again


def test_the_server_offers_no_onboarding_dialog(ui, platform):
    """What the UI asks before it shows the dialog, answered by the server itself."""
    assert platform.client().query("{ shouldShowNux }") == {"shouldShowNux": False}


def test_asset_graph_shows_the_five_assets(browser, ui, artifacts):
    _open(browser, f"{ui}/locations/definitions/asset-groups/training", ASSETS)
    browser.save_screenshot(str(artifacts / "asset_graph.png"))
    assert (artifacts / "asset_graph.png").stat().st_size > 10_000


def test_training_run_shows_cost_utilization_checks_and_the_loss_curve(browser, ui, demo, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # The asset's overview shows its newest materialization (on the shared server, maybe another module's run) with
    # the alert checks' results; the demo run's own materialization is its partition's.
    _open(browser, f"{ui}/assets/training_run", ["Latest materialization", "Latest check results"])
    browser.save_screenshot(str(artifacts / "training_run.png"))
    run_id = demo["run_id"]
    _open(
        browser,
        f"{ui}/assets/training_run?view=partitions&partition={run_id}",
        [run_id, "cost_usd", "utilization_pct", "data_wait_fraction", "loss_curve", "utilization_plot", "cost_plot"],
    )
    browser.save_screenshot(str(artifacts / "training_run_partition.png"))
    _click(
        browser,
        lambda d: d.find_element(By.XPATH, "//tr[td[normalize-space()='loss_curve']]").find_element(
            By.XPATH, ".//a[normalize-space()='[Show Markdown]'] | .//button[normalize-space()='[Show Markdown]']"
        ),
    )
    image = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.XPATH, "//img[starts-with(@src, 'data:image/png;base64,')]")
    )[0]
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return arguments[0].naturalWidth", image) > 100)
    browser.save_screenshot(str(artifacts / "training_run_loss_curve.png"))


def test_the_runs_page_shows_the_run_in_the_queue_with_its_team(browser, ui, demo, artifacts):
    run_id = demo["run_id"]
    _open(browser, f"{ui}/runs", [run_id, "team: ml-platform", "training_pipeline"])
    browser.save_screenshot(str(artifacts / "runs.png"))


def test_training_run_checks_list_the_alert_rules(browser, ui, demo, artifacts):
    _open(
        browser,
        f"{ui}/assets/training_run?view=checks",
        ["low_utilization", "data_wait", "checkpoint_overhead", "cost_outlier", "queue_wait"],
    )
    browser.save_screenshot(str(artifacts / "training_run_checks.png"))
