"""Every badge, status pill and chip in console.css has text at WCAG AA contrast (4.5:1) on its
own background (issue 33 §5: muted text was 4.40:1, the current step's "!" 2.27:1). The browser
test runs axe-core on the pages; this one also covers the badges those pages do not show."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

CSS = re.sub(
    r"/\*.*?\*/",
    "",
    (Path(settings.BASE_DIR) / "static" / "css" / "console.css").read_text(encoding="utf-8"),
    flags=re.S,
)
RULE = re.compile(r"^([^{}@/][^{}]*)\{([^{}]*)\}", re.M)
PILLS = {".badge": ".badge--", ".status": ".status--", ".chip": ".chip--"}


def _declarations(body: str) -> dict[str, str]:
    pairs = (part.split(":", 1) for part in body.split(";") if ":" in part)
    return {name.strip(): value.strip() for name, value in pairs}


def _rules() -> list[tuple[list[str], dict[str, str]]]:
    return [
        ([s.strip() for s in selectors.split(",")], _declarations(body))
        for selectors, body in RULE.findall(CSS)
    ]


def _colour(value: str, root: dict[str, str]) -> str:
    found = re.fullmatch(r"var\((--[\w-]+)\)", value)
    return _colour(root[found.group(1)], root) if found else value


def _luminance(hex_colour: str) -> float:
    channels = [int(hex_colour.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(foreground: str, background: str) -> float:
    light, dark = sorted([_luminance(foreground), _luminance(background)], reverse=True)
    return (light + 0.05) / (dark + 0.05)


def _pills() -> dict[str, tuple[str, str]]:
    rules = _rules()
    root = next(decls for selectors, decls in rules if selectors == [":root"])
    bases = {sel: decls for selectors, decls in rules for sel in selectors if sel in PILLS}
    found = {}
    for selectors, decls in rules:
        for selector in selectors:
            base = next((b for b, prefix in PILLS.items() if selector.startswith(prefix)), None)
            if base is None or " " in selector:
                continue
            merged = {**bases.get(base, {}), **decls}
            colours = merged.get("color"), merged.get("background")
            if all(colours):
                found[selector] = tuple(_colour(c, root) for c in colours)
    return found


def test_every_badge_status_and_chip_reads_at_aa_contrast():
    pills = _pills()
    assert {".status--needs_human", ".badge--outage", ".badge--approval"} <= set(pills)
    low = {
        selector: round(contrast(fg, bg), 2)
        for selector, (fg, bg) in pills.items()
        if contrast(fg, bg) < 4.5
    }
    assert not low, low


def test_muted_text_and_the_current_step_marker_read_at_aa_contrast():
    root = next(decls for selectors, decls in _rules() if selectors == [":root"])
    for background in ("#ffffff", "#f4f6fa", "#fafbfd", "#eef0f4"):
        assert contrast(root["--muted"], background) >= 4.5, background
    marker = next(
        decls for selectors, decls in _rules() if selectors == [".tl--current .tl-marker"]
    )
    assert contrast(marker["color"], marker["background"]) >= 4.5
