"""Emulated leaf-spine fabric in Linux network namespaces: plan (pure), apply, teardown, status."""

from testbed.netns.plan import Plan, PlanError, make_plan

__all__ = ["Plan", "PlanError", "make_plan"]
