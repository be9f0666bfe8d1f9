"""Whisper's languages by ISO 639-1 code and English name: OpenAI's verbose_json names the
language ("english"); a form's `language` may give either."""

from __future__ import annotations

from xattn.service.http.errors import bad_param

# openai-whisper's order (tests/test_http_api.py checks it against whisper.tokenizer.LANGUAGES)
LANGUAGES = dict(
    pair.split(":")
    for pair in (
        "en:english zh:chinese de:german es:spanish ru:russian ko:korean fr:french ja:japanese "
        "pt:portuguese tr:turkish pl:polish ca:catalan nl:dutch ar:arabic sv:swedish "
        "it:italian id:indonesian hi:hindi fi:finnish vi:vietnamese he:hebrew uk:ukrainian "
        "el:greek ms:malay cs:czech ro:romanian da:danish hu:hungarian ta:tamil no:norwegian "
        "th:thai ur:urdu hr:croatian bg:bulgarian lt:lithuanian la:latin mi:maori "
        "ml:malayalam cy:welsh sk:slovak te:telugu fa:persian lv:latvian bn:bengali "
        "sr:serbian az:azerbaijani sl:slovenian kn:kannada et:estonian mk:macedonian "
        "br:breton eu:basque is:icelandic hy:armenian ne:nepali mn:mongolian bs:bosnian "
        "kk:kazakh sq:albanian sw:swahili gl:galician mr:marathi pa:punjabi si:sinhala "
        "km:khmer sn:shona yo:yoruba so:somali af:afrikaans oc:occitan ka:georgian "
        "be:belarusian tg:tajik sd:sindhi gu:gujarati am:amharic yi:yiddish lo:lao uz:uzbek "
        "fo:faroese ht:haitian_creole ps:pashto tk:turkmen nn:nynorsk mt:maltese sa:sanskrit "
        "lb:luxembourgish my:myanmar bo:tibetan tl:tagalog mg:malagasy as:assamese tt:tatar "
        "haw:hawaiian ln:lingala ha:hausa ba:bashkir jw:javanese su:sundanese yue:cantonese"
    ).split()
)
LANGUAGES = {code: name.replace("_", " ") for code, name in LANGUAGES.items()}
_ALIASES = {
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht",
    "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
    "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh",
}  # fmt: skip
BY_NAME = {**{name: code for code, name in LANGUAGES.items()}, **_ALIASES}


def language_code(value: str) -> str:
    """ "en", "EN", "English" -> "en" (400 naming `language` for neither a code nor a name)."""
    key = value.strip().lower()
    if key in LANGUAGES:
        return key
    if key in BY_NAME:
        return BY_NAME[key]
    raise bad_param(
        "language",
        f"language {value!r} is not an ISO-639-1 code (e.g. en) or a language name",
        "unsupported_language",
    )


def language_name(code: str) -> str:
    """ "en" -> "english" (the code itself when unknown)."""
    return LANGUAGES.get(code, code)
