"""Actor runtime: actor base, supervisor, bounded channels, mailboxes. Knows nothing of LLMs."""

from trillium.runtime.actor import Actor
from trillium.runtime.channels import (
    GRAMMAR_INBOX_BOUND,
    INBOX_BOUND,
    METERING_INBOX_BOUND,
    TOKENIZER_INBOX_BOUND,
    open_inbox,
)
from trillium.runtime.mailbox import Mailbox, MailboxClosed
from trillium.runtime.supervisor import Supervisor

__all__ = [
    "GRAMMAR_INBOX_BOUND",
    "INBOX_BOUND",
    "METERING_INBOX_BOUND",
    "TOKENIZER_INBOX_BOUND",
    "Actor",
    "Mailbox",
    "MailboxClosed",
    "Supervisor",
    "open_inbox",
]
