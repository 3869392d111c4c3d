"""Settings files: an :class:`~svgen.adapt.config.AdaptConfig` read from JSON or TOML (``svgen fit --adapt-config``,
``svgen adapt --config``)."""

from __future__ import annotations

import json

from svgen.adapt.config import AdaptConfig
from svgen.errors import SvgenError
from svgen.reading import MAX_TEXT_BYTES, read_regular


def read_adapt_config(path, what: str = "adapt settings") -> AdaptConfig:
    """The settings in a JSON file, or a TOML one (``.toml``; Python 3.11's ``tomllib``, else the ``tomli`` package):
    one table of fields, e.g. ``{"level": 2.0, "alphas": [0, 1]}`` or ``level = 2.0``; the fields it does not name
    keep their defaults. A bad file, field or value is one :class:`SvgenError` line naming ``what`` and the path."""
    data = read_regular(path, MAX_TEXT_BYTES, what)
    where = f"{what} {path}"
    if str(path).lower().endswith(".toml"):
        settings = _toml(data, where)
    else:
        try:
            settings = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as e:
            raise SvgenError(f"{where} is not valid JSON ({str(e).splitlines()[0][:200]}); a .toml file is read as "
                             "TOML") from None
    return AdaptConfig.from_dict(settings, where)


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _toml(data: bytes, where: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:   # Python < 3.11
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise SvgenError(f"reading {where} as TOML needs Python 3.11 or the tomli package (pip install tomli); "
                             "or write the settings as JSON") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise SvgenError(f"{where} is not valid TOML ({str(e).splitlines()[0][:200]})") from None
