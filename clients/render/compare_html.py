"""The compare page: two transcriptions of one audio in one self-contained HTML file.

Each side's alignment is the inspector's own page (clients/render/html.py: its heatmap, views,
DTW word path, audio), embedded as an iframe (`srcdoc`), one above the other; a small script
inside each (assets/compare_frame.js) lets the outer page keep their time axes the same
(zooming or panning one moves the other). Above them: both sides' DTW word boxes on one time
axis and the transcripts aligned word by word, differences marked. Tests drive the page
through `window.xattnCompare`.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from xattn.clients.comparison import Side, WordPair, align_words, differences
from xattn.clients.render.html import ASSETS, _script_json, page, result_events


def inspector_page(side: Side, audio: bytes | None, audio_name: str) -> str:
    r = side.result
    return page(r.info, r.heads, result_events(r), audio, audio_name, scripts=("compare_frame.js",))


def _word(w: Any) -> dict[str, Any] | None:
    return None if w is None else w.to_dict()


def compare_data(a: Side, b: Side, pairs: tuple[WordPair, ...]) -> dict[str, Any]:
    def side(s: Side) -> dict[str, Any]:
        info = s.result.info
        return {
            "label": s.label,
            "model": info.name,
            "compute": info.compute_type,
            "layers": info.n_text_layer,
            "heads": info.n_text_head,
            "text": s.result.text,
            "words": [w.to_dict() for w in s.words],
        }

    duration = max(a.result.duration, b.result.duration, 1e-3)
    return {
        "duration": duration,
        "sides": [side(a), side(b)],
        "pairs": [{"a": _word(p.a), "b": _word(p.b), "same": p.same} for p in pairs],
        "differences": differences(pairs),
    }


def compare_page(a: Side, b: Side, audio: bytes | None, audio_name: str = "") -> str:
    pairs = align_words(a.words, b.words)
    data = compare_data(a, b, pairs)
    name = Path(audio_name).name
    replacements = {
        "{{TITLE}}": html.escape(f"xattn compare · {name or 'audio'}"),
        "{{META}}": html.escape(
            f"{name} · {a.label} vs {b.label} · {data['differences']} word differences"
        ),
        "{{LABEL_A}}": html.escape(a.label),
        "{{LABEL_B}}": html.escape(b.label),
        "{{FRAME_A}}": html.escape(inspector_page(a, audio, audio_name), quote=True),
        "{{FRAME_B}}": html.escape(inspector_page(b, audio, audio_name), quote=True),
        "{{CSS}}": (ASSETS / "compare.css").read_text("utf-8"),
        "{{JS}}": "(function () {\n" + (ASSETS / "compare.js").read_text("utf-8") + "\n})();",
        "{{DATA}}": _script_json(data),
    }
    template = (ASSETS / "compare.html").read_text("utf-8")
    # one pass over the template: the inserted values are never scanned for keys
    return re.sub(r"\{\{[A-Z_]+\}\}", lambda m: replacements[m.group(0)], template)
