"""The fleet file's tokenizers, loaded: one :class:`~routing.tokens.exact.PromptTokenizer` per
model named under ``routing.features.tokenizers``, shared by the gateway (feature extraction)
and the simulator (its engines' prompt tokens), so both count a prompt as the engine does.

:func:`load_prompt_tokenizers` loads every configured model once and logs, once per served
model, how its prompt tokens are counted: ``exact`` (the files, the chat template's content
format, whether the segment cache is on) or ``estimated`` (characters ÷ ``chars_per_token``);
one line for all when no model has a tokenizer.
A tokenizer that cannot be loaded stops start-up with :class:`FleetConfigError` naming the
field, unless its entry says ``required: false``: then the model is estimated and a WARNING
says why. :func:`pool_tokenizer` picks a pool's: the tokenizer of the first of its model names
that has one (a pool's names are one checkpoint's aliases).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from config.fleet import Fleet, FleetConfigError
from config.pools import Pool
from config.routing_section import FeatureSettings, TokenizerSettings
from routing.tokens.counters import tokenizers_available
from routing.tokens.exact import PromptTokenizer, load_prompt_tokenizer

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'ridge[tokenizers]'"


def load_one(model: str, files: TokenizerSettings) -> PromptTokenizer:
    """``model``'s tokenizer; FleetConfigError naming the field when it cannot be loaded."""
    where = f"routing.features.tokenizers.{model}"
    if not tokenizers_available():
        raise FleetConfigError(f"{where}: the 'tokenizers' package is not installed "
                               f"({INSTALL_HINT})")
    try:
        return load_prompt_tokenizer(files.path, files.chat_template, files.content_format)
    except ImportError as exc:
        raise FleetConfigError(f"{where}: {exc} ({INSTALL_HINT})") from exc
    except Exception as exc:  # noqa: BLE001 - the libraries raise their own exception types
        raise FleetConfigError(f"{where}: cannot load {files.path}: {exc}") from exc


def load_prompt_tokenizers(features: FeatureSettings, served: Iterable[str] = (),
                           report: bool = True) -> dict[str, PromptTokenizer]:
    """Every configured model's tokenizer (optional ones that fail are left out); logs (when
    ``report``) how each model of ``served`` and each configured one is counted."""
    loaded: dict[str, PromptTokenizer] = {}
    for model, files in features.tokenizers.items():
        try:
            loaded[model] = load_one(model, files)
        except FleetConfigError as exc:
            if files.required:
                raise
            log.warning("%s; prompt tokens of %s are estimated", exc, model)
    if report:
        _report(loaded, features, served)
    return loaded


def _report(loaded: Mapping[str, PromptTokenizer], features: FeatureSettings,
            served: Iterable[str]) -> None:
    if not features.tokenizers:
        log.info("prompt tokens of every model: %s (routing.features.tokenizers names a "
                 "model's tokenizer for exact counts)", describe(None, features))
        return
    for model in dict.fromkeys([*served, *features.tokenizers]):
        log.info("prompt tokens of %s: %s", model, describe(loaded.get(model), features))


def describe(tokenizer: PromptTokenizer | None, features: FeatureSettings) -> str:
    if tokenizer is not None:
        return tokenizer.describe()
    return f"estimated ({features.chars_per_token:g} characters a token)"


def fleet_tokenizers(fleet: Fleet, report: bool = True) -> dict[str, PromptTokenizer]:
    """:func:`load_prompt_tokenizers` of the fleet's settings and served models."""
    served = [m for p in fleet.pools for m in p.models]
    return load_prompt_tokenizers(fleet.routing.features, served, report)


def pool_tokenizer(pool: Pool,
                   tokenizers: Mapping[str, PromptTokenizer]) -> PromptTokenizer | None:
    """The pool's tokenizer: that of the first of its models that has one, else None."""
    return next((tokenizers[m] for m in pool.models if m in tokenizers), None)
