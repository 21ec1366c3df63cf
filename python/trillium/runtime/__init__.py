"""Actor runtime: actor base, supervisor, bounded channels, mailboxes, snapshots. Knows nothing of LLMs."""

from trillium.runtime.actor import Actor, Sink
from trillium.runtime.channels import (
    GRAMMAR_INBOX_BOUND,
    INBOX_BOUND,
    METERING_INBOX_BOUND,
    TOKENIZER_INBOX_BOUND,
    open_inbox,
)
from trillium.runtime.mailbox import Mailbox, MailboxClosed
from trillium.runtime.snapshot import Snapshot
from trillium.runtime.supervisor import Supervisor

__all__ = [
    "GRAMMAR_INBOX_BOUND",
    "INBOX_BOUND",
    "METERING_INBOX_BOUND",
    "TOKENIZER_INBOX_BOUND",
    "Actor",
    "Mailbox",
    "MailboxClosed",
    "Sink",
    "Snapshot",
    "Supervisor",
    "open_inbox",
]
