"""Continuous batching: request states, the step plan, KV block bookkeeping via ``_core``."""

from trillium.scheduler.policy import SchedulerConfig, SchedulerPolicy
from trillium.scheduler.request import Request, RequestStatus
from trillium.scheduler.step import StepPlan

__all__ = ["Request", "RequestStatus", "SchedulerConfig", "SchedulerPolicy", "StepPlan"]
