"""Convert a GGUF checkpoint into a Hugging Face folder that vLLM loads.

transformers 5 de-quantises GGUF on load but refuses ``save_pretrained`` on such a model,
so the weights are copied into a clean model built from the same config (without its
``quantization_config``) and saved from there. Usage: ``convert_model.py FILE.gguf OUT_DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def convert(gguf: Path, out: Path) -> None:
    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = clean.load_state_dict(loaded.state_dict(), strict=False)
    _check_weights(result.missing_keys, result.unexpected_keys,
                   bool(getattr(config, "tie_word_embeddings", False)))
    clean.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    clean.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out / "tokenizer_config.json")


def _check_weights(missing: list[str], unexpected: list[str], tied: bool) -> None:
    """Every weight of the clean model must come from the GGUF (the output head may be tied to
    the embeddings), or the saved model would hold random weights."""
    allowed = {"lm_head.weight"} if tied else set()
    absent = sorted(set(missing) - allowed)
    if absent or unexpected:
        raise SystemExit(f"GGUF weights do not fit the model: missing {absent}, "
                         f"unexpected {sorted(unexpected)}")


def _portable_tokenizer_config(path: Path) -> None:
    """transformers 5 writes ``TokenizersBackend``; other versions read the fast class."""
    data = json.loads(path.read_text())
    if data.get("tokenizer_class") == "TokenizersBackend":
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
