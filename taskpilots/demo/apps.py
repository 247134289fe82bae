from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo: tools and workflows against the simulated systems, the demo agent, and the
    commands that set up and seed `make run` (demo_setup, seed_demo, sandbox). Nothing in runs/
    or approvals/ imports it; it is loaded through TASKPILOTS_WORKFLOW_MODULES."""

    name = "taskpilots.demo"
    label = "demo"
    verbose_name = "Demo"
