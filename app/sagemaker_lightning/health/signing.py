"""The watchdog's values signed (heartbeats.py): the job's TCP store answers anyone who reaches MASTER_PORT, so every
value is HMAC-SHA256 signed with a key the ranks agree on over the process group (not through the store), and a value
longer than MAX_VALUE_BYTES is not read further.

    python -c "from sagemaker_lightning.health import signing as s; k = b'k' * 32; print(s.opened(k, 'a', s.signed(k, 'a', 'x').encode()))"
"""

import hashlib
import hmac
import secrets

KEY_BYTES = 32  # the job's signing key: drawn by rank 0, broadcast over the process group at the start of training
MAC_CHARS = 2 * hashlib.sha256().digest_size  # a value begins with its HMAC-SHA256 in hex
MAX_VALUE_BYTES = 64 * 1024  # a heartbeat is under 4 KB and a clipped abort line fits: a longer value is not ours


class Forged(Exception):
    """A value that this job's ranks did not write (unsigned, badly signed, or too long)."""


def agree_key(device) -> bytes:
    """The job's signing key: rank 0's random bytes, broadcast as a tensor over the default process group (every
    rank calls this at the same point). A tensor, not broadcast_object_list, which would unpickle what it receives."""
    import torch
    import torch.distributed as dist

    key = torch.frombuffer(bytearray(secrets.token_bytes(KEY_BYTES)), dtype=torch.uint8).to(device)
    dist.broadcast(key, src=0)  # the other ranks' draws are overwritten with rank 0's
    return bytes(key.cpu().tolist())


def _mac(key: bytes, name: str, text: str) -> str:
    """The value's signature, over its key's name too: a value copied to another key does not verify."""
    return hmac.new(key, f"{name}\n{text}".encode(), hashlib.sha256).hexdigest()


def signed(key: bytes, name: str, text: str) -> str:
    """`text` as the value of key `name`: its signature, then itself."""
    return _mac(key, name, text) + text


def clipped(text: str) -> str:
    """`text` cut so that its signed value fits MAX_VALUE_BYTES (an abort line naming thousands of ranks)."""
    room = MAX_VALUE_BYTES - MAC_CHARS - len("…".encode())
    raw = text.encode()
    return text if len(raw) <= MAX_VALUE_BYTES - MAC_CHARS else raw[:room].decode(errors="ignore") + "…"


def opened(key: bytes, name: str, value: bytes) -> str:
    """The text of a value of key `name` that this job's ranks signed; Forged otherwise. The length is checked
    before anything else is done with it."""
    if len(value) > MAX_VALUE_BYTES:
        raise Forged(f"{len(value)} bytes, over the {MAX_VALUE_BYTES} the watchdog reads")
    try:
        text = value[MAC_CHARS:].decode()
    except UnicodeDecodeError:
        raise Forged("not UTF-8 text") from None
    if not hmac.compare_digest(value[:MAC_CHARS], _mac(key, name, text).encode()):
        raise Forged("no valid signature")
    return text
