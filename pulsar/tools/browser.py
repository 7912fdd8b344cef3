"""Headless Chromium for the web page's browser test and its screenshot (``make
screenshot``), driven by Playwright.

It is the system's Chromium (``apt-get install chromium``), never a browser Playwright would
download: machines that run nodes and CI may have no internet. The flags keep Chromium from
calling home (component updates, sync, safe browsing): on a closed network those calls
only fail, slowly. Playwright is imported when a browser is launched, so the API does not
need it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any

__all__ = ["CHROMIUM_ARGS", "INSTALL_HINT", "chromium_path", "launch", "missing"]

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # as root (CI containers) Chromium refuses to start with its sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]
INSTALL_HINT = ("install the system's Chromium (apt-get install chromium) and Playwright "
                "(pip install -e '.[dev]'); `playwright install` is not needed")
_CANDIDATES = ("chromium", "chromium-browser")


def chromium_path() -> str | None:
    """``$PULSARCAST_CHROMIUM``, else ``/usr/bin/chromium`` or a chromium on the PATH."""
    given = os.environ.get("PULSARCAST_CHROMIUM")
    if given:
        return given if os.access(given, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


def missing() -> str | None:
    """Why no browser can be launched here (and how to fix it), or None if one can."""
    if importlib.util.find_spec("playwright") is None:
        return f"Playwright is not installed: {INSTALL_HINT}"
    if chromium_path() is None:
        where = os.environ.get("PULSARCAST_CHROMIUM") or "/usr/bin/chromium"
        return f"no Chromium found ({where}): {INSTALL_HINT}"
    return None


async def launch(playwright: Any) -> Any:
    """A headless Chromium browser from a started ``async_playwright()``."""
    path = chromium_path()
    if path is None:
        raise RuntimeError(f"no Chromium found: {INSTALL_HINT}")
    return await playwright.chromium.launch(executable_path=path, headless=True,
                                            args=CHROMIUM_ARGS)
