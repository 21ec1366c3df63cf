"""The chat page at ``/`` (server/static/chat.html) in a real headless Chromium, driven by Selenium.

Debian's ``chromium`` and ``chromium-driver`` (``scripts/setup.sh test`` installs them as root);
the tests skip, saying so, only where neither is found. A real server (``trillium serve`` in a
subprocess, as the integration tests start it) answers the page. Screenshots are kept in
``tests/artifacts/browser/`` (ignored by git; ``TRILLIUM_TEST_ARTIFACTS`` moves it).
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.integration.conftest import SERVER_ARGS, ServerProcess
from tests.integration.metered import KEYS, MeteredServer

ROOT = pathlib.Path(__file__).parents[2]
ARTIFACTS = pathlib.Path(os.environ.get("TRILLIUM_TEST_ARTIFACTS") or ROOT / "tests" / "artifacts") / "browser"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver", "/usr/lib/chromium/chromedriver")

CODE_PROMPT = "Show me a Python hello world program in a code block, then explain it in a bulleted list."
LONG_PROMPT = "Write a very long story about a dragon."  # greedy: the model writes until max tokens
STATS = {"tokens": "completionTokens", "tps": "tokensPerSecond", "ttft": "ttftMs"}


def find_browser() -> tuple[str, str] | None:
    """(browser, chromedriver) paths, or None."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = next((p for p in map(shutil.which, DRIVERS) if p), None)
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    found = find_browser()
    if found is None:
        pytest.skip(
            "no headless Chromium: install Debian's chromium and chromium-driver (scripts/setup.sh test, as root)"
        )
    browser, chromedriver = found
    options = Options()
    options.binary_location = browser  # with the driver's path below, Selenium Manager never runs
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture(scope="module")
def server(server_with: Callable[..., ServerProcess]) -> ServerProcess:
    """The integration tests' default server (the session's one with these flags)."""
    return server_with(*SERVER_ARGS)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MeteredServer]:
    """API keys: ``open`` without limits, ``rpm`` one request a minute."""
    srv = MeteredServer(tmp_path_factory.mktemp("keys"), tenants={"open": {}, "rpm": {"requests_per_minute": 1}})
    yield srv
    srv.stop()


def wait_for(chrome: WebDriver, condition: Callable[[], Any], timeout: float = 30, what: str = "") -> Any:
    try:
        return WebDriverWait(chrome, timeout, poll_frequency=0.1).until(lambda _: condition())
    except TimeoutException:
        screenshot(chrome, "timeout")
        raise AssertionError(f"timed out waiting for {what or condition}; messages: {messages(chrome)}") from None


def screenshot(chrome: WebDriver, name: str) -> pathlib.Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"chat_page_{name}.png"
    chrome.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path


def messages(chrome: WebDriver) -> list[dict[str, Any]]:
    """Every message in the conversation: role, state, status, text, rendered HTML, stats."""
    return chrome.execute_script(
        """return [...document.querySelectorAll('#messages .message')].map((m) => {
            const stats = m.querySelector('.stats');
            return {role: m.dataset.role, state: m.dataset.state || null, status: m.dataset.status || null,
                    text: m.querySelector('.content').textContent, html: m.querySelector('.content').innerHTML,
                    stats: stats ? {...stats.dataset, text: stats.textContent} : null};
        });"""
    )


def of_role(chrome: WebDriver, role: str) -> list[dict[str, Any]]:
    return [m for m in messages(chrome) if m["role"] == role]


def open_page(chrome: WebDriver, base_url: str, *, temperature: float = 0, max_tokens: int = 64) -> None:
    chrome.get(base_url + "/")
    set_value(chrome, "temperature", temperature)
    set_value(chrome, "max-tokens", max_tokens)


def set_value(chrome: WebDriver, element_id: str, value: object) -> None:
    element = chrome.find_element(By.ID, element_id)
    element.clear()
    element.send_keys(str(value))


def send(chrome: WebDriver, text: str) -> None:
    chrome.find_element(By.ID, "message-input").send_keys(text)
    chrome.find_element(By.ID, "send").click()


def csp_violations(chrome: WebDriver) -> list[str]:
    return [e["message"] for e in chrome.get_log("browser") if "Content Security Policy" in e["message"]]


# Payloads that a renderer which builds HTML could let through, and the Markdown it must render.
UNSAFE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "[click](javascript:alert(1))",
    "[click](data:text/html,<script>alert(1)</script>)",
    '[x](https://example.com/"onmouseover="alert(1))',
    "https://example.com/<b>onmouseover=alert(1)</b>",
    '**<a href="javascript:alert(1)">x</a>**',
    "```html\n<script>alert(1)</script>\n```",
    "`<svg onload=alert(1)>`",
    "| a | <b>b</b> |\n|---|---|\n| <i onclick=x>1</i> | 2 |",
    "> <iframe src=https://example.com></iframe>",
    "- <style>body{display:none}</style>\n  - [a](https://e.com)",
]
MARKDOWN = [
    ("# Title", "<h1>Title</h1>"),
    ("**bold**, *italic* and `a<b`", "<p><strong>bold</strong>, <em>italic</em> and <code>a&lt;b</code></p>"),
    (
        "```python\nif a < b:\n    print('x')\n```",
        '<pre data-lang="python"><code class="language-python">if a &lt; b:\n    print(&#39;x&#39;)</code></pre>',
    ),
    ("```\nunclosed fence, as while streaming", "<pre><code>unclosed fence, as while streaming</code></pre>"),
    (
        "[docs](https://example.com/a_b_c) here",
        '<p><a href="https://example.com/a_b_c" target="_blank" rel="noopener noreferrer">docs</a> here</p>',
    ),
    ("- a\n- b\n  - c\n\n1. x\n2. y", "<ul><li>a</li><li>b<ul><li>c</li></ul></li></ul><ol><li>x</li><li>y</li></ol>"),
    ("3. third", '<ol start="3"><li>third</li></ol>'),
    ("one\ntwo\n\nthree", "<p>one<br>two</p>\n<p>three</p>"),
]
ALLOWED_TAGS = {
    "P", "BR", "H1", "H2", "H3", "H4", "H5", "H6", "STRONG", "EM", "DEL", "CODE", "PRE", "A", "UL", "OL", "LI",
    "BLOCKQUOTE", "HR", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {"href", "target", "rel", "class", "data-lang", "start"}


def test_markdown_renderer_escapes_html_first(driver, server, random_seed):
    """The page's renderer on known Markdown, on known attacks, and on random mixes of Markdown
    and HTML syntax: only its own tags and attributes come out, links are http(s) only."""
    driver.get(server.base_url + "/")
    render = "return arguments[0].map((s) => window.trilliumChat.renderMarkdown(s));"
    assert driver.execute_script(render, [src for src, _ in MARKDOWN]) == [html for _, html in MARKDOWN]
    rng = random.Random(random_seed)
    pieces = ["<", ">", '"', "'", "&", "`", "```", "*", "_", "**", "[", "]", "(", ")", "#", "- ", "1. ", "|", "\n",
              "\n\n", "> ", " ", "a", "script", "onerror=", "javascript:", "https://x.y/", "<img src=x ", "~~"]  # fmt: skip
    fuzz = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    found = driver.execute_script(
        """return arguments[0].map((src) => {
            const box = document.createElement('div');
            box.innerHTML = window.trilliumChat.renderMarkdown(src);
            const all = [...box.querySelectorAll('*')];
            return {tags: all.map((e) => e.tagName), attributes: all.flatMap((e) => [...e.attributes].map((a) => a.name)),
                    hrefs: all.filter((e) => e.hasAttribute('href')).map((e) => e.getAttribute('href'))};
        });""",
        UNSAFE + fuzz,
    )
    for src, out in zip(UNSAFE + fuzz, found):
        assert set(out["tags"]) <= ALLOWED_TAGS, (src, out)
        assert set(out["attributes"]) <= ALLOWED_ATTRIBUTES, (src, out)
        assert all(h.startswith(("http://", "https://")) and '"' not in h for h in out["hrefs"]), (src, out)
    assert csp_violations(driver) == []


def test_streams_an_answer_with_tokens_and_timings(driver, server):
    open_page(driver, server.base_url, temperature=0, max_tokens=160)
    wait_for(driver, lambda: driver.find_element(By.ID, "model").get_attribute("data-loaded"), what="the model name")
    assert driver.find_element(By.ID, "model").text == "SmolLM2-135M-Instruct"
    assert not driver.find_element(By.ID, "api-key-box").is_displayed()  # an open server asks no key
    send(driver, CODE_PROMPT)
    wait_for(driver, lambda: of_role(driver, "assistant") and of_role(driver, "assistant")[0]["state"] == "done")
    answer = of_role(driver, "assistant")[0]
    # the default model's greedy answer: a fenced Python block, then a bulleted list
    assert '<pre data-lang="python"><code class="language-python">' in answer["html"] and "<ul>" in answer["html"]
    assert 'print("Hello World")' in answer["text"]
    tokens = int(answer["stats"][STATS["tokens"]])
    assert 1 <= tokens <= 160
    assert float(answer["stats"][STATS["ttft"]]) > 0 and float(answer["stats"][STATS["tps"]]) > 0
    assert "tokens/s" in answer["stats"]["text"] and "time to first token" in answer["stats"]["text"]
    screenshot(driver, "answer")
    # A second turn, with a system prompt (Enter sends): the conversation goes on.
    set_value(driver, "system-prompt", "You are a helpful assistant. Answer briefly.")
    driver.find_element(By.ID, "message-input").send_keys("What is the capital of France?", Keys.ENTER)
    wait_for(driver, lambda: [m["state"] for m in of_role(driver, "assistant")] == ["done", "done"])
    assert [m["role"] for m in messages(driver)] == ["user", "assistant", "user", "assistant"]
    assert "Paris" in of_role(driver, "assistant")[1]["text"]
    set_value(driver, "system-prompt", "")  # stored in localStorage, for the page's next load
    assert csp_violations(driver) == []


def test_stop_aborts_the_request_on_the_server(driver, server):
    http = httpx.Client(base_url=server.base_url, timeout=30)
    open_page(driver, server.base_url, temperature=0, max_tokens=1500)
    send(driver, LONG_PROMPT)
    wait_for(driver, lambda: len((of_role(driver, "assistant") or [{"text": ""}])[-1]["text"]) > 80, what="text")
    assert of_role(driver, "assistant")[-1]["state"] == "streaming"
    assert http.get("/stats").json()["num_requests_running"] == 1
    assert driver.find_element(By.ID, "send").get_attribute("disabled") is not None
    driver.find_element(By.ID, "stop").click()
    wait_for(driver, lambda: of_role(driver, "assistant")[-1]["state"] == "stopped", timeout=5, what="stopped")
    stopped = time.monotonic()
    while (stats := http.get("/stats").json())["num_requests_running"] or stats["num_requests_waiting"]:
        assert time.monotonic() - stopped < 10, f"the request still runs on the server: {stats}"
        time.sleep(0.05)
    print(f"the server freed the request {time.monotonic() - stopped:.2f} s after Stop")
    answer = of_role(driver, "assistant")[-1]
    screenshot(driver, "stopped")
    time.sleep(1.0)
    assert of_role(driver, "assistant")[-1]["text"] == answer["text"]  # the answer stopped growing
    assert http.get("/stats").json()["num_steps"] == stats["num_steps"]  # and the engine stopped stepping
    assert "stopped" in answer["stats"]["text"]
    assert driver.find_element(By.ID, "stop").get_attribute("disabled") is not None
    assert driver.find_element(By.ID, "send").get_attribute("disabled") is None
    http.close()


def test_keys_and_quotas_are_messages_in_the_page(driver, keyed_server):
    """401 without a key and with a wrong one, then an answer with the right one, then a 429."""
    open_page(driver, keyed_server.base_url, max_tokens=8)
    wait_for(driver, lambda: driver.find_element(By.ID, "api-key-box").is_displayed(), what="the key field")
    assert [m["status"] for m in of_role(driver, "notice")] == ["401"]
    send(driver, "Hi")
    wait_for(driver, lambda: of_role(driver, "error"), what="the 401")
    error = of_role(driver, "error")[-1]
    assert error["status"] == "401" and "didn't provide an API key" in error["text"]
    assert driver.find_element(By.ID, "message-input").get_attribute("value") == "Hi"  # to send again
    set_value(driver, "api-key", "sk-wrong")
    driver.find_element(By.ID, "send").click()
    wait_for(driver, lambda: len(of_role(driver, "error")) == 2, what="the second 401")
    error = of_role(driver, "error")[-1]
    assert error["status"] == "401" and "Incorrect API key provided." in error["text"]
    assert driver.find_element(By.ID, "api-key").get_attribute("aria-invalid") == "true"
    screenshot(driver, "401")

    set_value(driver, "api-key", KEYS["rpm"])
    driver.find_element(By.ID, "send").click()
    wait_for(driver, lambda: [m["state"] for m in of_role(driver, "assistant")] == ["done"], what="the answer")
    assert int(of_role(driver, "assistant")[0]["stats"][STATS["tokens"]]) >= 1
    stored = driver.execute_script("return localStorage.getItem('trillium.chat.apiKey');")
    assert stored == KEYS["rpm"]
    send(driver, "Again")
    wait_for(driver, lambda: len(of_role(driver, "error")) == 3, what="the 429")
    error = of_role(driver, "error")[-1]
    assert error["status"] == "429" and "Rate limit reached" in error["text"]
    assert driver.find_element(By.ID, "api-key").get_attribute("aria-invalid") == "false"
    assert [m["status"] for m in of_role(driver, "notice")] == ["401"]  # a new key only marks the field
    assert [m["role"] for m in messages(driver)].count("assistant") == 1  # no broken message
    screenshot(driver, "429")
    assert csp_violations(driver) == []


def test_a_server_that_went_away_is_a_message(driver, keyed_server):
    """A network failure is a message too. Runs last: it stops the keyed server."""
    open_page(driver, keyed_server.base_url)  # the key stored by the test before
    wait_for(driver, lambda: driver.find_element(By.ID, "model").get_attribute("data-loaded"), what="the model")
    keyed_server.stop()
    send(driver, "Hello?")
    wait_for(driver, lambda: of_role(driver, "error"), what="the network error")
    assert "network error" in of_role(driver, "error")[-1]["text"]
    assert [m["role"] for m in messages(driver)] == ["user", "error"]
    assert driver.find_element(By.ID, "message-input").get_attribute("value") == "Hello?"
