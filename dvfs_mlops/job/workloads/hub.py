"""The Hugging Face Hub: asked once per process whether it answers; when it does not, hub loads read the local caches.

Offline, `datasets.load_dataset` and transformers' `from_pretrained` each retry a name they cannot resolve with
backoff (datasets: 5 retries, 1+2+4+8+8 s, one log line each) before failing. The way to fail fast is theirs:
datasets' offline mode (`datasets.config.HF_HUB_OFFLINE`, what its own tests patch: huggingface/datasets
`tests/test_file_utils.py`; then `load_dataset` goes straight to `CachedDatasetModuleFactory`, datasets/load.py) and
huggingface_hub's (`constants.HF_HUB_OFFLINE`, which transformers' `is_offline_mode` reads) with `local_files_only=True`
for transformers' `from_pretrained` (`AutoConfig`, `AutoTokenizer`, the model). Either loads a copy a user cached while
online, or fails at once; the caller turns that into one line.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# One HEAD request, waited for this long at most: a resolver that fails answers at once, a firewall that drops packets
# (or a resolver that hangs) does not.
REACH_TIMEOUT_S = 3.0


def hub_endpoint() -> str:
    """The hub the libraries talk to: huggingface_hub's `ENDPOINT` (https://huggingface.co, or $HF_ENDPOINT)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


@functools.cache
def hub_reachable(endpoint: str) -> bool:
    """Whether `endpoint` answers an HTTP HEAD request within `REACH_TIMEOUT_S` (any status is an answer).

    Asked once per endpoint and process (a sweep of many hub workloads asks once). The request runs in a thread that
    is waited for at most `REACH_TIMEOUT_S`: a socket timeout does not bound the name lookup, a resolver that hangs
    would. Proxies are the environment's, as for the hub libraries themselves (`urllib.request.getproxies`).
    """
    answered: list[bool] = []
    asking = threading.Thread(target=lambda: answered.append(_answers(endpoint)), name="hub-reachable", daemon=True)
    asking.start()
    asking.join(REACH_TIMEOUT_S)
    reachable = bool(answered and answered[0])
    if not reachable:
        log.info("the Hugging Face Hub at %s is unreachable; hub loads read the local caches only", endpoint)
    return reachable


def _answers(endpoint: str) -> bool:
    """One HEAD request to `endpoint`: True on any HTTP answer, False when none came."""
    request = urllib.request.Request(endpoint, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=REACH_TIMEOUT_S):
            return True
    except urllib.error.HTTPError:
        return True  # it answered, if only to refuse
    except (OSError, ValueError):  # URLError, refused, timed out, a malformed endpoint
        return False


def is_local(name_or_path: str) -> bool:
    """A local folder (no hub request is made for it)."""
    return Path(name_or_path).expanduser().is_dir()


@contextlib.contextmanager
def pretrained_offline_unless_reachable(name_or_path: str) -> Iterator[dict[str, Any]]:
    """Load `name_or_path` with transformers in this block; yields the options for its `from_pretrained` calls.

    A hub name while the hub is unreachable: huggingface_hub's offline mode for the block (`constants.HF_HUB_OFFLINE`,
    read per request by its HTTP hook and by transformers' `is_offline_mode`) and `local_files_only=True` (the same for
    transformers releases that read the flag once at import): the cached copy, or an OSError at once. A local folder
    or a reachable hub: no options, nothing changed.
    """
    if is_local(name_or_path) or hub_reachable(hub_endpoint()):
        yield {}
        return
    from huggingface_hub import constants

    with _offline([(constants, "HF_HUB_OFFLINE")]):
        yield {"local_files_only": True}


@contextlib.contextmanager
def datasets_offline_unless_reachable() -> Iterator[bool]:
    """Run the block in datasets' offline mode when the hub is unreachable; yields whether it is reachable.

    Offline, `load_dataset` of a hub name reads the datasets cache and makes no request; its notes about using the
    cached copy are kept to the log (the caller says what it loaded).
    """
    if hub_reachable(hub_endpoint()):
        yield True
        return
    import datasets.config
    from huggingface_hub import constants

    with _offline([(datasets.config, "HF_HUB_OFFLINE"), (constants, "HF_HUB_OFFLINE")]):
        yield False


@contextlib.contextmanager
def _offline(flags: list[tuple[Any, str]]) -> Iterator[None]:
    """Set each (module, attribute) flag True and the hub libraries' loggers to ERROR for the block, then put back."""
    saved = [(module, name, getattr(module, name)) for module, name in flags]
    loggers = [logging.getLogger(name) for name in ("datasets", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for module, name in flags:
        setattr(module, name, True)
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
