"""The chat page at / in a real browser: Playwright driving headless Chromium types a
prompt, sees the reply stream in, presses Stop (the server cancels the sequence), then
gets a whole reply that equals the API's for the same conversation.

Needs `pip install "ggml_py[browser]"` and a Chromium: the system's (`apt install
chromium`; GGML_PY_CHROMIUM=/path/to/chrome picks another) or Playwright's own
(`playwright install chromium`). Skipped, saying which is missing, without them."""
import os
import shutil

import pytest
from server_harness import (
    MODEL_ID,
    Gate,
    LiveServer,
    bundled_llama,
    metrics,
    wait_until,
)

CANCELLED = 'ggml_server_sequences_total{finish_reason="cancelled"}'


def chromium_path(playwright):
    """A Chromium to drive: GGML_PY_CHROMIUM, the system's, or Playwright's; None if none."""
    for path in (os.environ.get("GGML_PY_CHROMIUM"), shutil.which("chromium"),
                 shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if path and os.path.exists(path):
            return path
    own = playwright.chromium.executable_path
    return own if own and os.path.exists(own) else None


@pytest.fixture(scope="module")
def page():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright is not installed: pip install "
                                          "'ggml_py[browser]'")
    with sync_api.sync_playwright() as p:
        path = chromium_path(p)
        if path is None:
            pytest.skip("no Chromium: apt install chromium, or playwright install chromium")
        browser = p.chromium.launch(executable_path=path, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_page()
        finally:
            browser.close()


def last_reply(page):
    return page.locator(".message.assistant").last


def test_the_chat_page_streams_stops_and_replies(page):
    gate = Gate()        # the test lets the batch step, so it sees a reply half-way
    live = LiveServer(gate.wrap(bundled_llama(n_seq_max=2, n_ctx=512))).wait_ready()
    try:
        page.goto(live.url + "/")
        page.wait_for_function("document.getElementById('status').textContent === 'ready'")
        assert page.text_content("#model") == MODEL_ID
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "300")
        page.fill("#prompt", "Who is there?")
        page.press("#prompt", "Enter")

        gate.allow(4)          # the prompt's step and three tokens
        page.wait_for_function("document.querySelector('.message.assistant').textContent"
                               ".length > 0")
        assert page.is_disabled("#send") and page.is_enabled("#stop")
        partial = last_reply(page).text_content()
        page.click("#stop")
        page.wait_for_selector(".message.assistant[data-done='true']")
        assert last_reply(page).get_attribute("data-stopped") == "true"
        assert page.is_enabled("#send") and page.is_disabled("#stop")
        shown = last_reply(page).text_content()
        assert shown.startswith(partial)

        def cancelled():
            gate.allow(1)
            return metrics(live.url).get(CANCELLED) == 1
        wait_until(cancelled, "the stopped reply's sequence to be cancelled")
        gate.open()

        client = live.client()
        first = [{"role": "user", "content": "Who is there?"}]
        whole = client.chat.completions.create(model=MODEL_ID, messages=first, max_tokens=300,
                                               temperature=0).choices[0].message.content
        assert whole.startswith(shown) and len(shown) < len(whole)

        page.fill("#max_tokens", "8")
        page.fill("#prompt", "Speak again.")
        page.click("#send")
        page.wait_for_selector(".message.assistant >> nth=1 >> xpath=self::*[@data-done='true']")
        history = first + [{"role": "assistant", "content": shown},
                           {"role": "user", "content": "Speak again."}]
        expected = client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=8,
                                                  temperature=0).choices[0].message.content
        assert last_reply(page).text_content() == expected
        assert last_reply(page).get_attribute("data-stopped") is None

        # a turn the server refuses (past the context) is shown, and left out of the
        # conversation the next message sends
        page.fill("#prompt", "ROMEO. " * 600)
        page.click("#send")
        done = "n => document.querySelectorAll(\".message[data-done='true']\").length === n"
        page.wait_for_function(done, arg=3)
        assert "maximum context length" in page.text_content(".message.error")
        page.fill("#prompt", "Once more.")
        page.click("#send")
        page.wait_for_function(done, arg=4)
        history += [{"role": "assistant", "content": expected},
                    {"role": "user", "content": "Once more."}]
        expected = client.chat.completions.create(model=MODEL_ID, messages=history, max_tokens=8,
                                                  temperature=0).choices[0].message.content
        assert last_reply(page).text_content() == expected
    finally:
        gate.open()
        live.stop()
