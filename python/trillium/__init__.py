"""trillium: an LLM inference server with an OpenAI-compatible HTTP/SSE API.

Public API: :class:`LLM` (offline inference) and :class:`SamplingParams`.
"""

from typing import TYPE_CHECKING, Any

from trillium.protocol import SamplingParams

if TYPE_CHECKING:
    from trillium.llm import LLM, RequestOutput

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # LLM pulls in torch and the model code; load it only when asked for.
    if name == "LLM":
        from trillium.llm import LLM

        return LLM
    if name == "RequestOutput":
        from trillium.llm import RequestOutput

        return RequestOutput
    raise AttributeError(name)


__all__ = ["LLM", "RequestOutput", "SamplingParams", "__version__"]
