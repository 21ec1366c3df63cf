"""Tool calling: the tools a request offers, how they reach the prompt, the grammar that keeps a
call well formed, and the parsers that turn the model's text back into OpenAI ``tool_calls``.

Pure text and JSON: no engine, no HTTP. The frontend (``server/``) drives it per request.
"""

from trillium.tools.formats import ToolFormat, tool_format
from trillium.tools.grammar import tool_grammar
from trillium.tools.parsers import ContentDelta, ToolCallParser, ToolCallReady, make_parser
from trillium.tools.prompt import prepare_conversation
from trillium.tools.spec import FunctionTool, ToolCall, ToolChoice, ToolSpecError

__all__ = [
    "ContentDelta",
    "FunctionTool",
    "ToolCall",
    "ToolCallParser",
    "ToolCallReady",
    "ToolChoice",
    "ToolFormat",
    "ToolSpecError",
    "make_parser",
    "prepare_conversation",
    "tool_format",
    "tool_grammar",
]
