"""Actor runtime: actor base, supervisor, bounded channels, mailboxes, snapshots, fault points.
Knows nothing of LLMs."""

from trillium.runtime.actor import NEVER_RESTART, Actor, RestartPolicy, Sink
from trillium.runtime.channels import (
    GRAMMAR_INBOX_BOUND,
    INBOX_BOUND,
    METERING_INBOX_BOUND,
    TOKENIZER_INBOX_BOUND,
    open_inbox,
)
from trillium.runtime.mailbox import Mailbox, MailboxClosed
from trillium.runtime.snapshot import Snapshot
from trillium.runtime.supervisor import Health, Supervisor

__all__ = [
    "GRAMMAR_INBOX_BOUND",
    "INBOX_BOUND",
    "METERING_INBOX_BOUND",
    "NEVER_RESTART",
    "TOKENIZER_INBOX_BOUND",
    "Actor",
    "Health",
    "Mailbox",
    "MailboxClosed",
    "RestartPolicy",
    "Sink",
    "Snapshot",
    "Supervisor",
    "open_inbox",
]
