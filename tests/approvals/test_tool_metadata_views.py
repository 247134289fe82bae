"""The tools page's metadata section: per tool its code's metadata, its MCP server's annotations,
the local decision in force and its history, and the admin's form to set or clear it (htmx, and
without JavaScript)."""

from __future__ import annotations

import pytest
from django.test import Client

from approvals.models import ToolMetadataOverride
from approvals.tool_metadata import anchor_of
from runs import tools
from runs.agents.mcp import McpTool
from runs.tools import ToolResult
from tests.approvals.console_helpers import fast_passwords, visible_text  # noqa: F401

pytestmark = pytest.mark.django_db

TOOLS, DECIDE = "/console/rules/tools/", "/console/rules/tools/metadata/"
HTMX = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "tools-main"}


def form(**fields):
    empty = {"risk": "", "side_effect": "", "dedupes_by_key": ""}
    return {"tool": "mail.send", "expected": "0", **empty, "reason": "mail bounces cost us",
            "do": "save", **fields}  # fmt: skip


@pytest.fixture
def git_commit(monkeypatch):
    """An MCP tool as mcp-server-git lists it: a commit it calls not destructive, so low."""
    annotations = {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False,
                   "title": "<img src=x onerror=alert(1)>"}  # fmt: skip
    tool = McpTool(name="mcp.git.git_commit", invoke=lambda p, c: ToolResult({}),
                   side_effect=True, risk="low", server="git", mcp_name="git_commit",
                   annotations=annotations)  # fmt: skip
    monkeypatch.setitem(tools._TOOLS, tool.name, tool)
    return tool


def test_an_admin_sets_a_decision_with_htmx_and_sees_it_in_force(client, admin_user):
    client.force_login(admin_user)
    response = client.post(DECIDE, form(risk="high"), **HTMX)
    assert response.status_code == 200
    page = response.content.decode()
    assert "<html" not in page and 'id="tools-main"' in page  # the page's main part only
    assert f'id="{anchor_of("mail.send")}" open' in page
    text = visible_text(response)
    assert "The decision over mail.send is saved" in text and "within 2 s" in text
    row = ToolMetadataOverride.objects.get()
    assert (row.tool, row.risk, row.changed_by, row.reason) == (
        "mail.send",
        "high",
        admin_user,
        "mail bounces cost us",
    )
    assert tools.get("mail.send").risk == "high"
    assert "Risk Medium High local decision" in text  # its code says, in force


def test_without_javascript_a_decision_redirects_to_its_entry(client, admin_user):
    client.force_login(admin_user)
    response = client.post(DECIDE, form(risk="high"))
    assert response.status_code == 302
    assert response["Location"] == f"{TOOLS}#{anchor_of('mail.send')}"
    assert "The decision over mail.send is saved" in visible_text(client.get(TOOLS))


def test_an_admin_clears_a_decision_back_to_the_tools_own_metadata(client, admin_user):
    client.force_login(admin_user)
    client.post(DECIDE, form(risk="high"))
    decided = ToolMetadataOverride.objects.get()
    response = client.post(DECIDE, form(expected=decided.pk, do="clear", reason="over",
                                        risk="high", confirm="on"), **HTMX)  # fmt: skip
    assert response.status_code == 200
    assert "mail.send is back to its own metadata" in visible_text(response)
    assert ToolMetadataOverride.in_force("mail.send").clears
    assert tools.get("mail.send") is tools.registered("mail.send")


def test_the_history_says_who_when_why_and_old_to_new(client, admin_user):
    client.force_login(admin_user)
    client.post(DECIDE, form(risk="high", reason="bounce storm"))
    first = ToolMetadataOverride.objects.get()
    client.post(DECIDE, form(expected=first.pk, risk="high", dedupes_by_key="true",
                             confirm="on", reason="the mail API honours keys now"))  # fmt: skip
    text = visible_text(client.get(TOOLS))
    assert "alex-admin · decided · Risk: Medium → High bounce storm" in text
    assert ("decided · Dedupes by key: no → yes confirmed less careful: Dedupes by key "
            "the mail API honours keys now") in text  # fmt: skip


def test_the_mcp_servers_annotations_are_shown_beside_the_code_and_escaped(
    client, admin_user, git_commit
):
    client.force_login(admin_user)
    response = client.post(DECIDE, form(tool=git_commit.name, risk="high",
                                        reason="a commit is <b>not</b> harmless"))  # fmt: skip
    assert response.status_code == 302
    response = client.get(TOOLS)
    page = response.content.decode()
    assert "<img src=x" not in page and "<b>not</b>" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "&lt;b&gt;not&lt;/b&gt;" in page
    text = visible_text(response)
    assert "MCP server git MCP tool git_commit" in text
    assert "destructiveHint: false" in text and "readOnlyHint: false" in text
    # Its code says low (from the annotations, which imply low), a person decided high.
    assert "Risk Low Low High local decision" in text
    assert tools.get(git_commit.name).risk == "high"
    assert tools.registered(git_commit.name) is git_commit


def test_an_mcp_tool_listed_without_annotations_has_the_mcp_defaults(
    client, admin_user, git_commit
):
    git_commit.annotations = {}
    client.force_login(admin_user)
    text = visible_text(client.get(TOOLS))
    assert "Its annotations none (the MCP defaults: a destructive, open-world side effect)" in text
    assert "Its annotations imply" in text


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [({"reason": "  "}, 422, "Say why; the history keeps it."),
     ({"risk": "extreme"}, 422, "Select a valid choice"),
     ({"side_effect": "maybe"}, 422, "Select a valid choice"),
     ({"expected": "first"}, 422, "Enter a whole number"),
     ({"tool": "mail.sned"}, 422, "Did you mean mail.send"),
     ({"side_effect": "false"}, 422, "would be called as a read"),
     ({"dedupes_by_key": "true"}, 422, "send it again under the same idempotency key"),
     ({"risk": "low"}, 422, "would go down from Medium to Low")],
)  # fmt: skip
def test_bad_input_is_refused_clearly_and_writes_nothing(client, admin_user, fields, status,
                                                         message):  # fmt: skip
    client.force_login(admin_user)
    for headers in ({}, HTMX):
        response = client.post(DECIDE, form(**fields), **headers)
        assert response.status_code == status
        assert message in visible_text(response)
    assert not ToolMetadataOverride.objects.exists()
    assert tools.get("mail.send") is tools.registered("mail.send")


def test_a_confirmed_loosening_is_saved_and_recorded_as_confirmed(client, admin_user):
    client.force_login(admin_user)
    response = client.post(DECIDE, form(side_effect="false", confirm="on"), **HTMX)
    assert response.status_code == 200
    assert ToolMetadataOverride.objects.get().loosened == ["side_effect"]
    assert tools.get("mail.send").side_effect is False


def test_a_form_older_than_the_decision_in_force_loses_with_what_is_in_force(client, admin_user):
    client.force_login(admin_user)
    client.post(DECIDE, form(risk="high", reason="first"))
    response = client.post(DECIDE, form(risk="medium", reason="second"), **HTMX)  # expected 0
    assert response.status_code == 409
    text = visible_text(response)
    assert "Someone else changed the metadata of mail.send first: alex-admin at" in text
    assert ToolMetadataOverride.objects.get().reason == "first"


def test_only_admins_decide_over_tools_metadata(client, support_user, auditor_user, outsider):
    for user in (support_user, auditor_user, outsider):
        client.force_login(user)
        assert client.post(DECIDE, form(risk="high")).status_code == 403
        assert client.post(DECIDE, form(risk="high"), **HTMX).status_code == 403
        assert client.get(TOOLS).status_code == 403
    client.logout()
    response = client.post(DECIDE, form(risk="high"))
    assert response.status_code == 302 and "/login" in response["Location"]
    assert not ToolMetadataOverride.objects.exists()


def test_the_decision_url_takes_only_posts_with_a_csrf_token(admin_user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    assert browser.get(DECIDE).status_code == 405
    assert browser.post(DECIDE, form(risk="high")).status_code == 403
    assert not ToolMetadataOverride.objects.exists()


def test_a_decision_for_a_tool_not_registered_here_is_listed(client, admin_user):
    ToolMetadataOverride.objects.create(tool="erp.post", risk="high", reason="another release",
                                        changed_by=admin_user)  # fmt: skip
    client.force_login(admin_user)
    text = visible_text(client.get(TOOLS))
    assert "erp.post · local decision" in text
    assert "not registered in this process" in text


def test_the_tools_page_costs_the_same_queries_with_decisions_and_history(
    client, admin_user, query_count
):
    client.force_login(admin_user)
    client.get(TOOLS)  # the session and the user's roles, as on any page
    with query_count() as bare:
        assert client.get(TOOLS).status_code == 200
    for name in ("mail.send", "crm.create", "payments.void"):
        for step, risk in enumerate(["high", "medium"] * 6):
            current = ToolMetadataOverride.in_force(name)
            ToolMetadataOverride.decide(tools.registered(name), admin_user, f"change {step}",
                                        risk=risk, confirmed=True)  # fmt: skip
            assert current is None or ToolMetadataOverride.in_force(name) != current
    with query_count() as decided:
        response = client.get(TOOLS)
    assert "The newest 10 changes are shown" in visible_text(response)
    assert len(decided) == len(bare), [q["sql"][:90] for q in decided.captured_queries]


def test_the_metadata_section_reads_in_chinese(client, admin_user):
    client.force_login(admin_user)
    zh = {"HTTP_ACCEPT_LANGUAGE": "zh-Hans"}
    client.post(DECIDE, form(risk="high"), **zh)
    text = visible_text(client.get(TOOLS, **zh))
    assert "引擎对每个工具的了解" in text and "What the engine knows" not in text
    assert "风险 中 高 本地决定" in text  # its code says medium, in force high
    response = client.post(DECIDE, form(expected=ToolMetadataOverride.objects.get().pk,
                                        risk="low"), **HTMX, **zh)  # fmt: skip
    assert response.status_code == 422
    assert "风险将从 高 降为 低" in visible_text(response)
