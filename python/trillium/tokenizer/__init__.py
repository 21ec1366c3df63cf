"""Text side of the model: encode, chat template, incremental detokenize."""

from trillium.tokenizer.detokenizer import IncrementalDetokenizer
from trillium.tokenizer.tokenizer import Tokenizer, load_tokenizer

__all__ = ["IncrementalDetokenizer", "Tokenizer", "load_tokenizer"]
