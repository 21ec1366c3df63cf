"""Continuous batching: request states, the step plan, KV block bookkeeping via ``_core``."""

from trillium.scheduler.policy import SchedulerConfig, SchedulerPolicy, StepPlan
from trillium.scheduler.request import Request, RequestStatus

__all__ = ["Request", "RequestStatus", "SchedulerConfig", "SchedulerPolicy", "StepPlan"]
