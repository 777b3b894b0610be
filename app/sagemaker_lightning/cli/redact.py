"""Secrets out of what a job keeps: the resolved configuration that goes into model.tar.gz (model_dir's config.yaml)
holds every setting as given, so a key or a password passed as a hyperparameter would travel with the model to
whoever can read the artifact. Only what is secret goes; every other setting stays as it was, so the configuration
still rebuilds the model.

What counts as secret (nothing is guessed from a value's look but an AWS access key id, whose form is fixed):
  - the value of a key that names a secret (SECRET_WORDS, SECRET_PAIRS, or a last word `token` that is not a
    vocabulary's: TOKEN_NOT_SECRET), whole, whatever it holds, unless it is None, a bool or empty (no secret in
    those, and `use_auth_token: true` stays true);
  - in any string: the user information of a URL (`scheme://user:password@host`), the values of a URL's query
    parameters whose names name a secret (a presigned URL's signature and credential), and AWS access key ids.
An AWS secret access key has no fixed form (40 characters of base64): it goes only under a key that names it.

    python -c "from sagemaker_lightning.cli import redact; print(redact.redacted({'db': 'postgres://u:pw@h/db', 'api_key': 'k'}))"
"""

import re

import yaml

REDACTED = "<redacted>"  # what a secret is replaced with
SECRET_WORDS = frozenset(  # a key with one of these words names a secret
    {"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials", "apikey", "auth"}
    | {"authorization", "signature", "sig"}
)
SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key")})  # adjacent words
TOKEN_NOT_SECRET = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "start", "end", "special"})  # pad_token
YAML = {"default_flow_style": False, "allow_unicode": True, "sort_keys": False}  # as jsonargparse dumps a configuration

WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")  # a key's words: snake, kebab, dotted and camel case
URL_USER = re.compile(
    r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]+@"
)  # scheme://user:password@ (user alone, an @ in it too)
QUERY_VALUE = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")  # ?name=value in a URL
HEADER = re.compile(r"(?:#.*\n)*")  # the comment lines a dump starts with
ACCESS_KEY_ID = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")  # long-term and temporary key ids


def secret_key(key: str) -> bool:
    """Whether a setting or parameter named `key` holds a secret: a word of SECRET_WORDS, two adjacent words of
    SECRET_PAIRS, or `token` as the last word, not a vocabulary's (max_tokens, token_dropout, pad_token are not)."""
    words = [w.lower() for w in WORDS.findall(str(key))]
    if SECRET_WORDS.intersection(words) or SECRET_PAIRS.intersection(zip(words, words[1:], strict=False)):
        return True
    return bool(words) and words[-1] == "token" and not (len(words) > 1 and words[-2] in TOKEN_NOT_SECRET)


def shown_url(text: str, instead: str = "") -> str:
    """`text` with each URL's user information (user:password@) replaced by `instead`: by nothing, the URL as the
    runtime's lines show it (an MLflow server's)."""
    return URL_USER.sub(lambda m: m[1] + instead, text)


def redacted_text(text: str) -> str:
    """`text` without a URL's user information, a URL's secret query values and AWS access key ids."""
    text = shown_url(text, f"{REDACTED}@")
    text = QUERY_VALUE.sub(lambda m: f"{m[1]}{m[2]}={REDACTED}" if secret_key(m[2]) and m[3] else m[0], text)
    return ACCESS_KEY_ID.sub(REDACTED, text)


def redacted(value, key: str = ""):
    """`value` (a configuration: mappings, lists, scalars) with its secrets replaced by REDACTED (module docstring);
    `key`: the name it is the value of."""
    if key and secret_key(key) and value not in (None, "", [], {}) and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, dict):
        return {k: redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return redacted_text(value) if isinstance(value, str) else value


def redacted_yaml(text: str) -> str:
    """A YAML configuration (as jsonargparse dumps one) with its secrets redacted, dumped as jsonargparse does; its
    header comments (Lightning's version line) kept."""
    header = HEADER.match(text)[0]
    return header + yaml.safe_dump(redacted(yaml.safe_load(text)), **YAML)
