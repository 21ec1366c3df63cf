"""JSON Schema ``format``: the known formats as grammar constraints, the unknown ones ignored.

Since draft 2019-09 ``format`` is an annotation unless a vocabulary asserts it, and a schema may
name formats of its own (``path``, ``gradle-enterprise:ldap-filter``). The server asserts the
formats the spec defines and OpenAPI's common ones, and ignores the rest (reported to the client,
or refused with ``--structured-strict-formats``):

* a string format is a regex over the whole string, compiled into the grammar as a ``pattern``;
* ``int32`` / ``int64`` bound numbers, compiled as ``minimum`` / ``maximum``;
* ``float`` / ``double`` constrain nothing (any JSON number is one).

The regexes accept a practical subset of each format, never more: every string they accept is
valid for the format as its RFC defines it (and as ``jsonschema``'s format checker and Python's
parsers read it), but not every valid string is accepted -- no leap seconds, no lower-case
``t``/``z`` in times, no quoted local parts in e-mail addresses, no IP literals in URIs, no
punycode labels in host names. :data:`FORMAT_CHECKER` checks values with the same regexes (and
int64's whole range, of which the grammar leaves out the ends), so the value checks
(``value_checks``) and the grammar agree on what a format accepts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import jsonschema

# ---- building blocks ------------------------------------------------------------------------

_HEX = "[0-9A-Fa-f]"
_PCT = f"%{_HEX}{{2}}"
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"  # Python's dates start at year 1
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = (
    "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
_HOUR_MINUTE = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
_TIME = f"{_HOUR_MINUTE}:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-]{_HOUR_MINUTE})"
_DURATION_TIME = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DURATION = (
    f"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DURATION_TIME})?"
    f"|{_DURATION_TIME}|[0-9]+W)"
)


def _label(alnum: str, ldh: str) -> str:
    """A host name label: 1-63 letters, digits and hyphens, a letter or digit at each end, and
    not "--" in the 3rd and 4th places (reserved for punycode, which IDNA checks)."""
    return f"{alnum}(?:{alnum}|{ldh}{alnum}|{ldh}(?:{ldh}{alnum}|(?:{alnum}{ldh}|-{alnum}){ldh}{{0,58}}{alnum}))?"


_HOST_LABEL = _label("[A-Za-z0-9]", "[A-Za-z0-9-]")
_HOSTNAME = f"{_HOST_LABEL}(?:\\.{_HOST_LABEL})*"
_IDN_LABEL = _label("[a-z0-9]", "[a-z0-9-]")  # IDNA 2008 refuses upper-case letters
_IDN_HOSTNAME = f"{_IDN_LABEL}(?:\\.{_IDN_LABEL})*"
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
# The local part: at most 64 characters (RFC 5321), as up to four dot-separated atoms.
_LOCAL_PART = "|".join(
    f"{_ATEXT}{{1,{size}}}(?:\\.{_ATEXT}{{1,{size}}}){{{dots}}}" for dots, size in ((0, 64), (1, 31), (2, 20), (3, 15))
)
_EMAIL = f"(?:{_LOCAL_PART})@{_HOSTNAME}"
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = f"(?:{_OCTET}\\.){{3}}{_OCTET}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"{_H16}:{_H16}"
_IPV6 = "|".join(  # RFC 3986's IPv6address, its ls32 without the IPv4 form
    [
        f"(?:{_H16}:){{6}}{_LS32}",
        f"::(?:{_H16}:){{5}}{_LS32}",
        f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
        f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
        f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
        f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
        f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
        f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
        f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
    ]
)
_UCSCHAR = "\\u00A0-\\uD7FF\\uF900-\\uFDCF\\uFDF0-\\uFFEF"  # RFC 3987's, in the Basic Multilingual Plane


def _uri_forms(extra: str) -> tuple[str, str]:
    """(absolute, reference) forms of RFC 3986 (``extra``: more unreserved characters, for the
    IRIs of RFC 3987), without IP-literal hosts."""
    chars = f"A-Za-z0-9._~{extra}!$&'()*+,;="  # unreserved and sub-delims, but "-" (last in a class)
    pchar = f"(?:[{chars}:@-]|{_PCT})"
    segment_nz_nc = f"(?:[{chars}@-]|{_PCT})+"
    authority = f"(?:(?:[{chars}:-]|{_PCT})*@)?(?:[{chars}-]|{_PCT})*(?::[0-9]*)?"
    path_abempty = f"(?:/{pchar}*)*"
    path_absolute = f"/(?:{pchar}+{path_abempty})?"
    tail = f"(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"
    hier = f"(?://{authority}{path_abempty}|{path_absolute}|{pchar}+{path_abempty}|)"
    absolute = f"[A-Za-z][A-Za-z0-9+.-]*:{hier}{tail}"
    relative = f"(?://{authority}{path_abempty}|{path_absolute}|{segment_nz_nc}{path_abempty}|){tail}"
    return absolute, f"(?:{absolute}|{relative})"


_URI, _URI_REFERENCE = _uri_forms("")
_IRI, _IRI_REFERENCE = _uri_forms(_UCSCHAR)
_VARCHAR = f"(?:[A-Za-z0-9_]|{_PCT})"
_VARSPEC = f"{_VARCHAR}(?:\\.?{_VARCHAR})*(?::[1-9][0-9]{{0,3}}|\\*)?"
_URI_TEMPLATE = f"(?:[!#$&(-;=?-\\[\\]_a-z~]|{_PCT}|\\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*"
_JSON_POINTER = "(?:/(?:[ -.0-}]|~[01])*)*"  # reference tokens of printable ASCII


def _regex_syntax(depth: int) -> str:
    """Regexes both ECMA-262 and Python's ``re`` compile: printable ASCII literals, escapes,
    classes, ``.``, anchors, alternation, quantifiers (greedy or lazy) and groups nested ``depth``
    deep. Positive classes only: llguidance lets a JSON escape (``\\\\``) through a negated one."""
    literal = "[ !\"#%&',\\-/0-9:;<=>@A-Z_`a-z~]"
    escape = "\\\\[dDwWsSntrfv\\\\^$.|?*+()\\[\\]{}/]"
    class_item = "(?:[ !\"#$%'()*+,./0-9:;<=>?@A-Z_`a-z{}]|\\\\[dDwWsSntrfv\\\\^$.|?*+()\\[\\]{}/-]|a-z|A-Z|0-9)"
    ranges = "|".join(f"{low},[{low}-9]" for low in range(10))  # {m,n} needs m <= n
    quantifier = f"(?:(?:[*+?]|\\{{(?:[0-9]{{1,3}},?|[0-9],[1-9][0-9]{{1,2}}|{ranges})\\}})\\??)"
    atom = f"(?:{literal}|{escape}|\\[\\^?{class_item}+\\]|\\.)"
    alternatives = f"(?:{atom}{quantifier}?|[$^|])*"
    for _ in range(depth):
        alternatives = f"(?:(?:{atom}|\\((?:\\?:)?{alternatives}\\)){quantifier}?|[$^|])*"
    return alternatives


# ---- the known formats ----------------------------------------------------------------------

# Format -> the regex a whole string of it matches.
STRING_FORMATS: dict[str, str] = {
    "date-time": f"{_DATE}T{_TIME}",
    "date": _DATE,
    "time": _TIME,
    "duration": _DURATION,
    "email": _EMAIL,
    "idn-email": _EMAIL,  # ASCII addresses: a subset of the internationalized ones
    "hostname": _HOSTNAME,
    "idn-hostname": _IDN_HOSTNAME,
    "ipv4": _IPV4,
    "ipv6": _IPV6,
    "uri": _URI,
    "uri-reference": _URI_REFERENCE,
    "iri": _IRI,
    "iri-reference": _IRI_REFERENCE,
    "uuid": f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}",
    "uri-template": _URI_TEMPLATE,
    "json-pointer": _JSON_POINTER,
    "relative-json-pointer": f"(?:0|[1-9][0-9]*)(?:#|{_JSON_POINTER})",
    "regex": _regex_syntax(3),
    "byte": "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",  # OpenAPI: base64
}
# Formats whose strings are limited in length besides their regex.
MAX_LENGTHS = {"hostname": 253, "idn-hostname": 253, "email": 254, "idn-email": 254}
# OpenAPI's integer formats -> (the range a value of it lies in, the range the grammar generates).
# llguidance cannot build a range that reaches -2**63, so int64's grammar leaves out the 1024
# values at either end of the range.
NUMBER_FORMATS: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "int32": ((-(2**31), 2**31 - 1), (-(2**31), 2**31 - 1)),
    "int64": ((-(2**63), 2**63 - 1), (-(2**63) + 1024, 2**63 - 1024)),
}
ANY_FORMATS = frozenset({"float", "double"})  # OpenAPI's: every JSON number is one
KNOWN_FORMATS = frozenset(STRING_FORMATS) | frozenset(NUMBER_FORMATS) | ANY_FORMATS
MAX_NAMED = 8  # ignored formats a warning names


class UnknownFormat(ValueError):
    """A schema names a format the server does not know, and unknown formats are refused."""


def format_constraint(name: Any) -> dict[str, Any] | None:
    """The grammar keywords that enforce format ``name`` ({} when it constrains nothing, as a
    non-string ``format`` does not); None when the format is unknown. The keywords apply to the
    value's type only, as ``format`` does (a ``pattern`` leaves numbers alone)."""
    if not isinstance(name, str) or name in ANY_FORMATS:
        return {}
    if name in STRING_FORMATS:
        constraint: dict[str, Any] = {"pattern": f"^(?:{STRING_FORMATS[name]})$"}
        if name in MAX_LENGTHS:
            constraint["maxLength"] = MAX_LENGTHS[name]
        return constraint
    if name in NUMBER_FORMATS:
        low, high = NUMBER_FORMATS[name][1]
        return {"minimum": low, "maximum": high}
    return None


def ignored_formats_warning(names: list[str] | tuple[str, ...]) -> str:
    """What the client is told of formats a schema names and the server ignored: the names quoted
    as JSON (ASCII, so the text can go in an HTTP header), at most ``MAX_NAMED`` of them."""
    quoted = ", ".join(json.dumps(name) for name in names[:MAX_NAMED])
    more = f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
    return f"JSON schema formats not enforced (unknown to the server): {quoted}{more}"


def _check_string(name: str) -> Callable[[object], bool]:
    regex = re.compile(STRING_FORMATS[name])
    max_len = MAX_LENGTHS.get(name)

    def check(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        return regex.fullmatch(instance) is not None and (max_len is None or len(instance) <= max_len)

    return check


def _check_number(name: str) -> Callable[[object], bool]:
    low, high = NUMBER_FORMATS[name][0]

    def check(instance: object) -> bool:
        if isinstance(instance, bool) or not isinstance(instance, (int, float)):
            return True
        return low <= instance <= high

    return check


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker(formats=())
    for name in STRING_FORMATS:
        checker.checks(name)(_check_string(name))
    for name in NUMBER_FORMATS:
        checker.checks(name)(_check_number(name))
    return checker


# What the value checks read ``format`` with: the known formats as the grammar enforces them,
# the others ignored.
FORMAT_CHECKER = _format_checker()
