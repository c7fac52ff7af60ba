"""The dashboard in headless Chromium (Debian's `chromium`, driven by Playwright): with jobs going through a real
server started with an API key, the page shows that server's numbers and updates as they change.

The tests write screenshots for a person to look at: `.pytest-artifacts/dashboard.png` (and
`dashboard-actions.png`, the action scheduler's panel) at the repository root.
Chromium missing: the test skips, or fails with `PRORL_REQUIRE_CHROMIUM=1` (set by scripts/test.sh where
scripts/system-deps.sh installed it).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import shutil
import threading

import pytest
from handlers_for_tests import GatedHandler, MultiTurnChatHandler, RaisingHandler
from polling import wait_for
from repo_paths import REPO
from server_jobs import result

from prorl_server import AgentHandler, JobContext
from prorl_server.observability.metrics import TOKEN_BUCKETS

REQUIRE_CHROMIUM_ENV = "PRORL_REQUIRE_CHROMIUM"
SCREENSHOT = REPO / ".pytest-artifacts" / "dashboard.png"
ACTIONS_SCREENSHOT = SCREENSHOT.with_name("dashboard-actions.png")
API_KEY = "dashboard-test-key"
HOSTILE_ID = "<img src=x onerror=window.pwned=1>"
NO_VALUE = "\N{EN DASH}"  # what the page shows before its first data, and for a missing reward


@pytest.fixture
def chromium() -> str:
    """The path of Debian's chromium."""
    path = shutil.which("chromium")
    if path is None:
        if os.environ.get(REQUIRE_CHROMIUM_ENV) == "1":
            pytest.fail(f"{REQUIRE_CHROMIUM_ENV}=1 but chromium is not installed (scripts/system-deps.sh)")
        pytest.skip("chromium is not installed (scripts/system-deps.sh installs Debian's package as root)")
    return path


def test_dashboard_shows_the_servers_numbers(chromium, start_server, backend):
    from playwright.sync_api import sync_playwright

    gated = GatedHandler()
    handlers = {"multiturn": MultiTurnChatHandler(), "raising": RaisingHandler(), "gated": gated}
    server = start_server([backend.address], handlers=handlers, run_workers=2, api_key=API_KEY)
    server.http.headers["Authorization"] = f"Bearer {API_KEY}"

    finished = {"m1": 1, "m2": 2, "m3": 3, HOSTILE_ID: 2}  # multiturn jobs and their turns
    for job_id, turns in finished.items():
        body = {"instance": {"data_source": "multiturn", "question": "q"}, "job_id": job_id}
        assert server.http.post("/jobs", json={**body, "sampling_params": {"max_turns": turns}}).status_code == 202
    server.http.post("/jobs", json={"instance": {"data_source": "raising", "fail_in": "run"}, "job_id": "bad"})
    results = {job_id: result(server, job_id) for job_id in [*finished, "bad"]}
    # three held jobs: two busy in RUN (its two workers), one queued for RUN
    for i in range(3):
        gated.proceed[f"g{i}"] = threading.Event()
        body = {"instance": {"data_source": "gated", "question": "q"}, "job_id": f"g{i}"}
        assert server.http.post("/jobs", json={**body, "sampling_params": {"max_turns": 2}}).status_code == 202

    def holding() -> bool:
        status = server.http.get("/status").json()
        return status["queues"]["run"] == 1 and status["busy_workers"]["run"] == 2

    wait_for(holding, 20, "two jobs running and one queued for RUN")
    status = server.http.get("/status").json()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{server.url}/dashboard")
            page.wait_for_selector("#key-form:not([hidden])")  # the data needs the key: the page asks for it
            assert page.text_content("#stage-run-busy") == NO_VALUE
            page.fill("#key-input", API_KEY)
            page.click("#key-form button")
            page.wait_for_selector("body[data-loaded='1']")
            assert not page.is_visible("#key-form")
            assert API_KEY not in page.url
            assert page.evaluate("sessionStorage.getItem('prorl-api-key')") == API_KEY

            def shown(selector: str) -> str | None:
                return page.text_content(selector)

            assert not page.is_visible("#health") and not page.is_visible("#health-problems")
            for stage in ("init", "run", "eval"):
                assert shown(f"#stage-{stage}-queue") == str(status["queues"][stage])
                assert shown(f"#stage-{stage}-busy") == str(status["busy_workers"][stage])
                assert shown(f"#stage-{stage}-workers") == str(status["workers"][stage])
            assert shown("#finished-completed") == "4" and shown("#finished-failed") == "1"
            assert shown("#results-held") == "5"

            row = page.locator(f"#backends tr[data-address='{backend.address}'] td")
            assert row.all_text_contents()[:3] == [backend.address, "healthy", "closed"]

            rows = page.locator("#recent-jobs tbody tr")
            assert rows.count() == 5
            for i in range(5):
                cells = rows.nth(i).locator("td").all_text_contents()
                expected = results[cells[0]]
                trajectory = expected["trajectory"]
                assert cells[1] == expected["status"]
                assert cells[3] == (NO_VALUE if expected["reward"] is None else f"{expected['reward']:.3f}")
                assert cells[4] == str(len(trajectory["prompt_ids"]) + len(trajectory["response_ids"]))
                assert cells[5] == str(len(trajectory["turns"]))
            assert "ValueError: tool crashed" in page.text_content("#recent-jobs tr[data-job-id='bad']")
            # a job id is text, never markup
            assert page.locator("#recent-jobs td", has_text=HOSTILE_ID).count() == 1
            assert page.locator("#recent-jobs img").count() == 0 and page.evaluate("window.pwned") is None

            lengths = page.locator("#lengths rect").evaluate_all("r => r.map(e => Number(e.dataset.count))")
            expected_lengths = [0] * (len(TOKEN_BUCKETS) + 1)
            for r in results.values():
                tokens = len(r["trajectory"]["prompt_ids"]) + len(r["trajectory"]["response_ids"])
                expected_lengths[bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            assert lengths == expected_lengths
            jobs = page.locator("#throughput rect").evaluate_all("r => r.map(e => Number(e.dataset.count))")
            assert sum(jobs) == 5

            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            print(f"dashboard screenshot: {SCREENSHOT}")

            for event in gated.proceed.values():  # the held jobs finish: the page follows
                event.set()
            wait_for(lambda: shown("#finished-completed") == "7", 20, "the page shows the held jobs completed")
            wait_for(lambda: shown("#stage-run-busy") == "0", 20, "the page shows RUN idle")
        finally:
            browser.close()


def test_dashboard_data_and_metrics_need_the_key(start_server, backend):
    server = start_server([backend.address], api_key=API_KEY)
    for path in ("/dashboard", "/dashboard/dashboard.js", "/dashboard/dashboard.css"):
        response = server.http.get(path)  # static files, no server data: open
        assert response.status_code == 200, path
        assert "default-src 'none'" in response.headers["content-security-policy"]
    for path in ("/dashboard/data", "/metrics"):
        assert server.http.get(path).status_code == 401, path
        assert server.http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401, path
    good = {"Authorization": f"Bearer {API_KEY}"}
    assert server.http.get("/dashboard/data", headers=good).json()["backends"][0]["address"] == backend.address
    metrics = server.http.get("/metrics", headers=good)
    assert metrics.status_code == 200 and "prorl_stage_queue_depth" in metrics.text


def test_dashboard_says_when_the_server_is_degraded(chromium, start_server, start_backend):
    from playwright.sync_api import sync_playwright

    backend = start_backend()
    server = start_server(
        [backend.address], handlers={"multiturn": MultiTurnChatHandler()}, health_check_interval_s=0.2
    )
    backend.server.stop()
    wait_for(lambda: server.http.get("/health").status_code == 503, 20, "the server degraded")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{server.url}/dashboard")
            page.wait_for_selector("body[data-loaded='1']")
            assert page.is_visible("#health") and page.text_content("#health") == "degraded"
            assert page.text_content("#health-problems") == "all 1 LLM backends fail their health checks"
        finally:
            browser.close()


class HeldActionHandler(AgentHandler):
    """RUN: in a sandbox, a bash action of kind `tests`, then a grant of kind `held` kept until `release` is set."""

    name = "held-action"

    def __init__(self) -> None:
        self.release = threading.Event()

    async def run(self, ctx: JobContext) -> None:
        sandbox = await ctx.start_sandbox()
        await sandbox.bash("sleep 0.1", kind="tests")
        async with sandbox.grant("held", 1):
            while not self.release.is_set():
                await asyncio.sleep(0.01)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_dashboard_shows_the_action_pool(chromium, start_server, backend):
    from playwright.sync_api import sync_playwright

    handler = HeldActionHandler()
    server = start_server([backend.address], handlers={"held-action": handler}, runtime="local", action_cpu_reserve=0)
    assert (
        server.http.post("/jobs", json={"instance": {"data_source": "held-action"}, "job_id": "h"}).status_code == 202
    )

    def held() -> bool:
        return "held" in server.http.get("/status").json()["actions"]["kinds"]

    wait_for(held, 30, "the job holding its `held` grant")
    actions = server.http.get("/status").json()["actions"]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(f"{server.url}/dashboard")
            page.wait_for_selector("body[data-loaded='1']")
            assert page.is_visible("#actions-section")

            def shown(selector: str) -> str | None:
                return page.text_content(selector)

            cores = actions["cores"]
            assert (shown("#actions-busy"), shown("#actions-cores")) == ("1", str(cores))
            assert (shown("#actions-running"), shown("#actions-waiting")) == ("1", "0")
            assert shown("#actions-utilisation") == f"{100 / cores:.0f}%"
            assert page.eval_on_selector("#actions-meter", "m => m.value") == 1 / cores
            tests = actions["kinds"]["tests"]
            cells = page.locator("#action-kinds tr[data-kind='tests'] td").all_text_contents()
            assert cells == [
                "tests",
                "1",
                "1",
                "0",
                f"{tests['mean_act_s']:.3f}",
                f"{tests['mean_queue_s']:.3f}",
                "1.00",
            ]
            assert float(cells[4]) >= 0.1  # the sleep
            held_row = page.locator("#action-kinds tr[data-kind='held'] td")
            assert held_row.all_text_contents() == [
                "held",
                "1",
                "0",
                "0",
                NO_VALUE,
                f"{actions['kinds']['held']['mean_queue_s']:.3f}",
                "1.00",
            ]
            wait_for(lambda: shown("#actions-recent").endswith("%"), 10, "the utilisation between two updates")

            ACTIONS_SCREENSHOT.parent.mkdir(exist_ok=True)
            page.locator("#actions-section").screenshot(path=str(ACTIONS_SCREENSHOT))
            print(f"actions panel screenshot: {ACTIONS_SCREENSHOT}")

            handler.release.set()  # the grant returns: the page follows
            wait_for(lambda: shown("#actions-busy") == "0", 20, "the page shows the pool idle")
            wait_for(lambda: held_row.all_text_contents()[2] == "1", 20, "the page shows the held action completed")
        finally:
            browser.close()


def test_dashboard_hides_the_actions_panel_without_the_scheduler(chromium, start_server, backend):
    from playwright.sync_api import sync_playwright

    server = start_server([backend.address], action_scheduler=False)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{server.url}/dashboard")
            page.wait_for_selector("body[data-loaded='1']")
            assert not page.is_visible("#actions-section")
        finally:
            browser.close()
