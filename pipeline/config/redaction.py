"""Secrets kept out of everything a run prints or records.

A config value is a secret when it came from ``${VAR}`` (the environment is
where secrets live, never YAML) or when its key is named like one. The runs
table, ``pipeline check`` and the report show ``***`` in its place.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

__all__ = ["REDACTED", "redact_config", "scrub"]

REDACTED = "***"
# key names whose values are secrets: anywhere for the unambiguous words, as the last word for token/key
# (so max_new_tokens, token_budget and keep_columns stay readable)
_SECRET_KEY = re.compile(
    r"(password|passwd|secret|credential)|(^|[._-])(pwd|token|key|apikey|auth|authorization)$", re.IGNORECASE
)


def redact_config(data: Any, env_paths: Iterable[str] = (), *, _where: str = "") -> Any:
    """``data`` (a config dict) with secrets replaced by ``***``.

    A value is a secret when it came from ``${VAR}`` (its key path is in
    ``env_paths``, as :func:`pipeline.config.build_config` records them) or
    when its key is named like one (password, secret, credential anywhere;
    token, key, pwd, auth as the last word).

    >>> redact_config({"sink": {"path": "s3://b/t"}, "spark": {"conf": {"fs.s3a.secret.key": "abc"}},
    ...                "batching": {"token_budget": 4096}}, {"sink.path"})
    {'sink': {'path': '***'}, 'spark': {'conf': {'fs.s3a.secret.key': '***'}}, 'batching': {'token_budget': 4096}}
    """
    env = env_paths if isinstance(env_paths, (set, frozenset)) else frozenset(env_paths)
    if isinstance(data, Mapping):
        out = {}
        for key, value in data.items():
            where = f"{_where}.{key}" if _where else str(key)
            secret = (where in env or bool(_SECRET_KEY.search(str(key)))) and value is not None
            out[key] = REDACTED if secret else redact_config(value, env, _where=where)
        return out
    if isinstance(data, list):
        return [REDACTED if f"{_where}[{i}]" in env else redact_config(v, env, _where=f"{_where}[{i}]")
                for i, v in enumerate(data)]
    return data



def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of a secret value replaced by ``***``: for error messages a library
    wrote (a store's reply may quote a key), before they are printed or recorded.

    >>> scrub("access key AKIA123 denied", ["AKIA123", ""])
    'access key *** denied'
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text
