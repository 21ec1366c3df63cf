"""trillium: an LLM inference server with an OpenAI-compatible HTTP/SSE API.

Public API: :class:`LLM` (offline inference) and :class:`SamplingParams`.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trillium.llm import LLM, RequestOutput
    from trillium.protocol import SamplingParams

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Loaded only when asked for: LLM pulls in torch and the model code, SamplingParams msgspec;
    # ``import trillium._core`` (a host embedding the core) needs neither.
    if name == "SamplingParams":
        from trillium.protocol import SamplingParams

        return SamplingParams
    if name == "LLM":
        from trillium.llm import LLM

        return LLM
    if name == "RequestOutput":
        from trillium.llm import RequestOutput

        return RequestOutput
    raise AttributeError(name)


__all__ = ["LLM", "RequestOutput", "SamplingParams", "__version__"]
