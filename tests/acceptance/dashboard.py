"""A real Chromium (Debian's, driven by Playwright) on a live server's /ui, for the
dashboard's tests: every request the page makes is recorded, and any request to
anywhere but the server is refused and fails the test (the page must work offline)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from playwright.async_api import Browser, Page, Request, Route, async_playwright

CHROMIUM = "/usr/bin/chromium"  # Debian's; Playwright's own download cannot run here


@dataclass
class Visit:
    """One browser page on a server, and what it asked the network for."""

    page: Page
    requests: list[str] = field(default_factory=list)  # "METHOD path" as the server saw it
    answers: list[tuple[int, str]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)  # refused: not the server
    errors: list[str] = field(default_factory=list)  # uncaught script errors

    def asked(self, prefix: str) -> list[str]:
        return [r for r in self.requests if r.split(" ", 1)[1].startswith(prefix)]


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    if not os.path.exists(CHROMIUM):  # noqa: ASYNC240 (one stat, before the browser starts)
        raise RuntimeError(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            await browser.close()


@contextlib.asynccontextmanager
async def visit(browser: Browser, origin: str) -> AsyncIterator[Visit]:
    context = await browser.new_context(base_url=origin, viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    seen = Visit(page)

    async def only_the_server(route: Route, request: Request) -> None:
        if request.url == origin or request.url.startswith(origin + "/"):
            seen.requests.append(f"{request.method} {request.url[len(origin) :]}")
            await route.continue_()
        else:
            seen.outside.append(request.url)
            await route.abort()

    await context.route("**/*", only_the_server)
    page.on("pageerror", lambda error: seen.errors.append(str(error)))
    page.on("response", lambda r: seen.answers.append((r.status, r.url)))
    try:
        yield seen
    finally:
        await context.close()
    assert not seen.outside, f"the page asked outside the server: {seen.outside}"
    assert not seen.errors, f"script errors: {seen.errors}"
