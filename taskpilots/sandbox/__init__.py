"""Simulated external systems (mail, tickets, crm, payments, kb) run as their own process.

The server (`taskpilots.sandbox.server`) uses only the standard library and never imports Django, so
tests and drills can start, kill and restart it quickly, like a real dependency. See
docs/sandbox.md.
"""

from __future__ import annotations
