"""Secrets out of what a job keeps: the resolved configuration that goes into model.tar.gz (model_dir's config.yaml)
holds every setting as given, so a key or a password passed as a hyperparameter would travel with the model to
whoever can read the artifact. Only what is secret goes; every other setting stays as it was, so the configuration
still rebuilds the model.

What counts as secret (nothing is guessed from a value's look but the credentials whose form is fixed: FORMS):
  - the value of a key that names a secret (secret_key: SECRET_WORDS, SECRET_PAIRS, a service's key, a last word
    `token` or `pass` that is not a vocabulary's or a pass over data, `tokens` of a credential), whole, whatever it
    holds, unless it is None, a bool or empty (no secret in those, and `use_auth_token: true` stays true); a bare
    `key` is named by its parent's key too (`wandb: {key: ...}`);
  - in any string: the user information of a URL (`scheme://user:password@host`), the values of a URL's query and
    fragment parameters whose names name a secret or are `key` (a presigned URL's signature and credential,
    `?key=...`, `#access_token=...`), the value of a word `NAME=value` or an option `--name value` whose name names a
    secret (an `env:` list's `HF_TOKEN=...`, `--password x` inside a command), and the credentials of FORMS (AWS
    access key ids; Hugging Face, GitHub, OpenAI-style `sk-` and Google API keys) wherever they stand.
An AWS secret access key has no fixed form (40 characters of base64): it goes only under a key that names it.

    python -c "from sagemaker_lightning.toolbox import redact; print(redact.redacted({'db': 'postgres://u:pw@h/db', 'api_key': 'k'}))"
"""

import re

import yaml

REDACTED = "<redacted>"  # what a secret is replaced with
SECRET_WORDS = frozenset(  # a key with one of these words names a secret
    {"password", "passwd", "passphrase", "pwd", "secret", "secrets", "credential", "credentials", "apikey", "auth"}
    | {"authorization", "signature", "sig"}
)
KEY_SERVICES = frozenset(  # services whose credential is called their key: wandb_key, `wandb: {key: ...}`
    {"wandb", "comet", "neptune", "clearml", "hf", "huggingface", "openai", "anthropic"}
)
SECRET_PAIRS = frozenset(  # adjacent words
    {("api", "key"), ("access", "key"), ("private", "key"), ("secret", "key"), ("session", "key")}
    | {(service, "key") for service in KEY_SERVICES}
)
JOINED = {a + b: (a, b) for a, b in SECRET_PAIRS}  # the same words run together: privatekey, accesskey
TOKEN_NOT_SECRET = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "start", "end", "special"})  # pad_token
TOKENS_OF = frozenset(  # a last word `tokens` names secrets after one of these: hf_tokens (max_tokens is a count)
    {"hf", "api", "access", "auth", "bearer", "refresh", "session", "id", "github", "gh", "oauth"}
)
PASS_NOT_SECRET = frozenset(  # a last word `pass` is a pass over data after one of these: forward_pass
    {"forward", "backward", "first", "second", "last", "single", "multi", "one", "two", "each", "per", "full"}
)
YAML = {"default_flow_style": False, "allow_unicode": True, "sort_keys": False}  # as jsonargparse dumps a configuration

WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")  # a key's words: snake, kebab, dotted and camel case
URL_USER = re.compile(
    r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]+@"
)  # scheme://user:password@ (user alone, an @ in it too)
QUERY_VALUE = re.compile(r"([?&;#])([^=&;#\s]+)=([^&;#\s]*)")  # ?name=value, #name=value in a URL
QUERY_KEYS = frozenset({"key"})  # a URL's parameter that holds an API key by its name alone (Google's ?key=AIza...)
VALUE = r"(\"[^\"]*\"|'[^']*'|\S+)"  # a word's value: quoted, or up to the next space
ASSIGNMENT = re.compile(r"(?<!\S)(-{0,2}[A-Za-z_][\w.-]*)=" + VALUE)  # NAME=value, --name=value: a word of its own
OPTION = re.compile(r"(?<!\S)(--?[A-Za-z][\w.-]*)(\s+)(?!-)" + VALUE)  # --name value
HEADER = re.compile(r"(?:#.*\n)*")  # the comment lines a dump starts with
FORMS = re.compile(  # credentials of a fixed form, wherever they stand
    r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])"  # AWS access key ids, long-term and temporary
    r"|(?<![A-Za-z0-9_])(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,})(?![A-Za-z0-9])"
    r"|(?<![\w-])sk-[\w-]{20,}"  # OpenAI's (sk-, sk-proj-) and Anthropic's (sk-ant-)
    r"|(?<![\w-])AIza[\w-]{35}(?![\w-])"  # Google API keys
)


def words(key) -> list[str]:
    """A key's words, lower case, with JOINED pairs and a `token` run into a word (sessiontoken) taken apart."""
    found = []
    for word in (w.lower() for w in WORDS.findall(str(key))):
        if word in JOINED:
            found += JOINED[word]
        elif word.endswith("token") and word != "token":
            found += [word.removesuffix("token"), "token"]
        else:
            found.append(word)
    return found


def secret_key(key: str, parent: str = "") -> bool:
    """Whether a setting or parameter named `key` holds a secret: a word of SECRET_WORDS, two adjacent words of
    SECRET_PAIRS, or as the last word `token` not a vocabulary's (max_tokens, token_dropout, pad_token are not),
    `tokens` of TOKENS_OF, `pass` not a pass over data. A bare `key` is read with `parent`'s last word (wandb.key)."""
    found = words(key)
    if found == ["key"]:
        found = words(parent)[-1:] + found
    if SECRET_WORDS.intersection(found) or SECRET_PAIRS.intersection(zip(found, found[1:], strict=False)):
        return True
    before, last = ["", "", *found][-2:]
    return (
        (last == "token" and before not in TOKEN_NOT_SECRET)
        or (last == "tokens" and before in TOKENS_OF)
        or (last == "pass" and before not in PASS_NOT_SECRET)
    )


def shown_url(text: str, instead: str = "") -> str:
    """`text` with each URL's user information (user:password@) replaced by `instead`: by nothing, the URL as the
    runtime's lines show it (an MLflow server's)."""
    return URL_USER.sub(lambda m: m[1] + instead, text)


def redacted_text(text: str) -> str:
    """`text` without a URL's user information, a URL's secret query values, the values of secret NAME=value words
    and --name options, and the credentials of FORMS."""
    text = shown_url(text, f"{REDACTED}@")
    text = QUERY_VALUE.sub(
        lambda m: f"{m[1]}{m[2]}={REDACTED}" if (secret_key(m[2]) or m[2].lower() in QUERY_KEYS) and m[3] else m[0],
        text,
    )
    text = ASSIGNMENT.sub(lambda m: f"{m[1]}={REDACTED}" if secret_key(m[1]) else m[0], text)
    text = OPTION.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}" if secret_key(m[1]) else m[0], text)
    return FORMS.sub(REDACTED, text)


def redacted(value, key: str = "", parent: str = ""):
    """`value` (a configuration: mappings, lists, scalars) with its secrets replaced by REDACTED (module docstring);
    `key`: the name it is the value of, in a mapping named `parent`."""
    if key and secret_key(key, parent) and value not in (None, "", [], {}) and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, dict):
        return {k: redacted(v, str(k), key) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return redacted_text(value) if isinstance(value, str) else value


def redacted_yaml(text: str) -> str:
    """A YAML configuration (as jsonargparse dumps one) with its secrets redacted, dumped as jsonargparse does; its
    header comments (Lightning's version line) kept."""
    header = HEADER.match(text)[0]
    return header + yaml.safe_dump(redacted(yaml.safe_load(text)), **YAML)
