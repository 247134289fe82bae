"""Bad input to the API (issue 32 §3): every one gets a clear error in the API's shape, with
400 or 422, and nothing is written — days with no end, edits the tool's own schema refuses, a
key twice in a body, invisible characters in identifiers and bulk filters, nesting deep enough
to exhaust the parser, business keys that would tell a guess, and the schema stating the rules.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from django.utils import timezone

from approvals import bulk
from approvals.models import ApprovalRequest, HumanDecision
from approvals.models.bulk import BulkAction
from runs import engine
from runs.api.errors import MAX_JSON_DEPTH
from runs.api.models import ApiClient, ApiScope, PersonalToken
from runs.invisible import (
    DEFAULT_IGNORABLE_RANGES,
    IDENTIFIER_FORBIDDEN_RANGES,
    forbidden_in_identifier,
)
from runs.models import InboundEvent, Run, TimelineEvent
from tests.runs.test_api import Api, bearer, start_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(support_user):
    # A support person's own token: the bulk actions and decisions below are a person's.
    _, issued = PersonalToken.issue(support_user, "scripts", ApiScope.values)
    return Api(bearer(issued.token))


def counts() -> dict[str, int]:
    """The rows a refused request must not have written."""
    return {
        "runs": Run.objects.count(),
        "events": InboundEvent.objects.count(),
        "timeline": TimelineEvent.objects.count(),
        "decisions": HumanDecision.objects.count(),
        "bulk": BulkAction.objects.count(),
    }


def error_of(data: dict) -> tuple[str, str | None]:
    return data["error"]["code"], data["error"]["field"]


# --------------------------------------------------------------------------------------------
# 1. Days with no end (or no start) in the bulk preview's filters


class TestBulkPreviewDays:
    def preview(self, api, **filters):
        body = {"user": "sam-support", "action": "retry", "filters": filters, "comment": "x"}
        return api.post("/bulk-actions/preview", body)

    @pytest.mark.parametrize(
        ("name", "day"),
        [("date_to", "9999-12-31"), ("date_from", "9999-12-31"), ("date_from", "0000-01-01"),
         ("date_to", "2026-02-30"), ("date_to", "2025-02-29"), ("date_from", "10000-01-01")],
    )  # fmt: skip
    def test_a_day_with_no_end_or_that_does_not_exist_is_422_naming_the_filter(
        self, api, support_user, name, day
    ):
        before = counts()
        status, data = self.preview(api, **{name: day})
        assert status == 422, data
        assert error_of(data)[1] == f"filters.{name}"
        assert "Traceback" not in json.dumps(data)
        assert counts() == before

    def test_the_last_day_with_an_end_and_a_leap_day_are_accepted(self, api, support_user):
        status, data = self.preview(api, date_from="2024-02-29", date_to="9999-12-30")
        assert status == 200, data
        assert data["status"] == "previewed"

    def test_a_day_whose_start_is_before_year_one_in_the_viewers_zone_is_refused(
        self, support_user
    ):
        # The console's zone is the viewer's: midnight of 0001-01-01 in Shanghai (local mean
        # time then, UTC+8:05) is in the year 0 in UTC.
        timezone.activate("Asia/Shanghai")
        try:
            with pytest.raises(bulk.BulkError) as refused:
                bulk.preview(support_user, "retry", {"date_from": "0001-01-01"}, {})
        finally:
            timezone.deactivate()
        assert refused.value.field == "date_from"
        assert "0001-01-01" in str(refused.value)
        assert not BulkAction.objects.exists()


# --------------------------------------------------------------------------------------------
# 3. Edits the tool's own input schema refuses


@pytest.fixture
def refund_approval(api):
    status, data = api.post("/runs", {
        "workflow": "refund.approval", "business_key": "refund-bad-edits",
        "input": {"payment_id": "pay_9", "amount": 250, "currency": "EUR", "reason": "damaged"},
    })  # fmt: skip
    assert status == 201, data
    run = engine.run_until_quiet(data["id"])
    assert run.status == "needs_human"
    return ApprovalRequest.objects.get(run=run)


PROPOSED = {"payment_id": "pay_9", "amount": 250.0, "currency": "EUR", "reason": "damaged"}


class TestEditsCheckedAgainstTheToolsSchema:
    @pytest.mark.parametrize(
        ("edit", "field"),
        [({"amount": -5}, "amount"),
         ({"amount": 0}, "amount"),
         ({"amount": 1e308}, "amount"),
         ({"currency": 978}, "currency"),
         ({"currency": {"code": "EUR"}}, "currency"),
         ({"currency": "eur"}, "currency"),
         ({"currency": "EURO"}, "currency"),
         ({"payment_id": ""}, "payment_id"),
         ({"payment_id": "   "}, "payment_id"),
         ({"reason": ["too", "late"]}, "reason"),
         ({"amount": True}, "amount")],
    )  # fmt: skip
    def test_an_edit_the_schema_forbids_is_422_naming_the_parameter(
        self, api, refund_approval, support_user, edit, field
    ):
        before = counts()
        status, data = api.post(f"/approvals/{refund_approval.pk}/decision", {
            "user": "sam-support", "decision": "approved_with_edits",
            "edited_params": {**PROPOSED, **edit},
        })  # fmt: skip
        assert status == 422, data
        assert error_of(data) == ("invalid_params", f"edited_params.{field}")
        assert ApprovalRequest.objects.get(pk=refund_approval.pk).status == "pending"
        assert counts() == before

    @pytest.mark.parametrize("dropped", ["payment_id", "amount"])
    def test_a_required_parameter_dropped_is_422_naming_it(
        self, api, refund_approval, support_user, dropped
    ):
        before = counts()
        edited = {k: v for k, v in PROPOSED.items() if k != dropped}
        status, data = api.post(f"/approvals/{refund_approval.pk}/decision", {
            "user": "sam-support", "decision": "approved_with_edits", "edited_params": edited,
        })  # fmt: skip
        assert status == 422, data
        assert error_of(data) == ("invalid_params", f"edited_params.{dropped}")
        assert counts() == before

    def test_an_edit_within_the_schema_is_recorded(self, api, refund_approval, support_user):
        edited = {**PROPOSED, "amount": 99.5, "currency": "USD"}
        status, data = api.post(f"/approvals/{refund_approval.pk}/decision", {
            "user": "sam-support", "decision": "approved_with_edits", "edited_params": edited,
        })  # fmt: skip
        assert status == 200, data
        assert ApprovalRequest.objects.get(pk=refund_approval.pk).edited_params == edited

    def test_every_demo_tool_states_a_full_input_schema(self):
        from runs import tools
        from runs.agents import tool_info

        for name in ("mail.send", "tickets.update", "tickets.get", "crm.lookup", "crm.create",
                     "crm.tag", "payments.refund", "payments.void", "kb.search", "kb.faq",
                     "mail.relay_down"):  # fmt: skip
            schema = tool_info(name).input_schema
            assert schema.get("type") == "object", name
            jsonschema.validators.validator_for(schema).check_schema(schema)
            # Every flat parameter the engine checks is a required property of the schema.
            assert set(tools.registered(name).params_schema) <= set(schema["required"]), name


# --------------------------------------------------------------------------------------------
# 4. A key twice in one object


class TestDuplicateKeys:
    @pytest.mark.parametrize(
        ("raw", "field"),
        [(b'{"workflow": "test.api_order", "workflow": "test.kb", "input": {"order": "o"},'
          b' "business_key": "k"}', "workflow"),
         (b'{"workflow": "test.api_order", "input": {"order": "a", "order": "b"},'
          b' "business_key": "k"}', "input.order"),
         (b'{"workflow": "test.api_order", "input": {"x": [{"a": 1, "a": 1}]},'
          b' "business_key": "k"}', "input.x[0].a")],
    )  # fmt: skip
    def test_a_key_twice_is_400_duplicate_key_naming_where(self, api, raw, field):
        before = counts()
        status, data = api.post("/runs", raw=raw)
        assert status == 400, data
        assert error_of(data) == ("duplicate_key", field)
        assert "twice" in data["error"]["message"]
        assert counts() == before

    def test_the_acting_user_named_twice_is_refused_not_the_last_one_taken(
        self, api, refund_approval, support_user, admin_user
    ):
        before = counts()
        raw = b'{"user": "alex-admin", "user": "sam-support", "decision": "approved"}'
        status, data = api.post(f"/approvals/{refund_approval.pk}/decision", raw=raw)
        assert (status, *error_of(data)) == (400, "duplicate_key", "user")
        assert ApprovalRequest.objects.get(pk=refund_approval.pk).status == "pending"
        assert counts() == before


# --------------------------------------------------------------------------------------------
# 5. Invisible characters in identifiers and bulk filters

INVISIBLE = ["\u3164", "\u115f", "\u2800", "\u034f", "\ufe0f", "\u2028", "\u2029", "\u202e",
             "\u200b", "\u0007", "\U000e0041", "\U000e0100", "\u180b", "\u00ad"]  # fmt: skip


class TestInvisibleCharactersInIdentifiers:
    @pytest.mark.parametrize("char", INVISIBLE)
    @pytest.mark.parametrize("field", ["business_key", "session_context_ref"])
    def test_a_start_with_one_is_422_naming_the_field(self, api, char, field):
        before = counts()
        body = {**start_body(), field: f"order{char}1"}
        status, data = api.post("/runs", body)
        assert status == 422, data
        assert error_of(data) == ("invalid_characters", field)
        assert f"U+{ord(char):04X}" in data["error"]["message"]
        assert counts() == before

    @pytest.mark.parametrize("char", INVISIBLE)
    def test_an_event_id_with_one_is_422(self, api, char):
        before = counts()
        body = {"event_id": f"evt{char}1", "event_type": "order.paid", "correlation_key": "o-1",
                "payload": {}}  # fmt: skip
        status, data = api.post("/events", body)
        assert (status, *error_of(data)) == (422, "invalid_characters", "event_id")
        assert counts() == before

    @pytest.mark.parametrize("char", ["\u202e", "\u0007", "\u3164", "\u2800", "\ufe0f"])
    @pytest.mark.parametrize("name", ["workflow", "step", "tool", "queue"])
    def test_a_bulk_filter_with_one_is_422_naming_the_filter(self, api, support_user, char, name):
        before = counts()
        body = {"user": "sam-support", "action": "retry", "filters": {name: f"a{char}b"}}
        status, data = api.post("/bulk-actions/preview", body)
        assert (status, *error_of(data)) == (422, "invalid_characters", f"filters.{name}")
        assert counts() == before

    def test_a_nul_in_a_bulk_filter_is_400(self, api, support_user):
        body = {"user": "sam-support", "action": "retry", "filters": {"tool": "mail\u0000send"}}
        status, data = api.post("/bulk-actions/preview", body)
        assert (status, *error_of(data)) == (400, "nul_byte", "filters.tool")
        assert not BulkAction.objects.exists()

    def test_the_console_filters_refuse_them_with_the_same_table(self, support_user):
        for char in ("\u202e", "\u0007", "\u3164", "\x00"):
            with pytest.raises(bulk.BulkError) as refused:
                bulk.preview(support_user, "retry", {"tool": f"mail{char}.send"}, {})
            assert refused.value.field == "tool"
        assert not BulkAction.objects.exists()

    def test_names_in_any_script_and_emoji_are_still_identifiers(self, api):
        status, data = api.post("/runs", start_body(key="退款-订单-١٠٤٢-ünï-🙂"))
        assert status == 201, data

    def test_the_table_is_the_definition_over_all_of_unicode(self):
        # Written out because scanning Unicode costs most of a second at start-up; this says
        # which ranges to write when a new Python ships newer Unicode data.
        found, start = [], None
        for code in range(0x110000):
            hidden = not 0xD800 <= code <= 0xDFFF and forbidden_in_identifier(chr(code))
            if hidden and start is None:
                start = code
            elif not hidden and start is not None:
                found.append((start, code - 1))
                start = None
        assert tuple(found) == IDENTIFIER_FORBIDDEN_RANGES
        # Default_Ignorable_Code_Point has 4,174 code points (Unicode 15.0 to 16.0).
        assert sum(high - low + 1 for low, high in DEFAULT_IGNORABLE_RANGES) == 4174

    def test_the_schema_pattern_refuses_exactly_what_the_server_refuses(self, api):
        _, document = api.get("/openapi.json")
        pattern = document["components"]["schemas"]["StartRunIn"]["properties"]["business_key"]
        compiled = re.compile(pattern["pattern"])
        for char in INVISIBLE:
            assert not compiled.search(f"a{char}b"), f"U+{ord(char):04X}"
        assert compiled.search("退款-ünï-🙂")
        filters = document["components"]["schemas"]["BulkFiltersIn"]["properties"]
        for name in ("workflow", "step", "tool", "queue"):
            assert filters[name]["pattern"] == pattern["pattern"], name


# --------------------------------------------------------------------------------------------
# 6. Nesting deep enough to exhaust the parser: the documented too_deep, not Python's words


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


class TestDeepNesting:
    @pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 500, 990, 1000, 5000, 100_000])
    def test_a_deep_input_is_400_too_deep(self, api, depth):
        before = counts()
        raw = b'{"workflow": "test.api_order", "business_key": "k", "input": {"x": '
        raw += nested(depth) + b"}}"
        status, data = api.post("/runs", raw=raw)
        assert (status, data["error"]["code"]) == (400, "too_deep"), data
        assert "recursion" not in data["error"]["message"]
        assert counts() == before

    @pytest.mark.parametrize("depth", [30, 40_000])
    def test_a_deep_body_of_objects_is_400_too_deep(self, api, depth):
        status, data = api.post("/runs", raw=b'{"a":' * depth + b"1" + b"}" * depth)
        assert (status, data["error"]["code"]) == (400, "too_deep"), data

    def test_deep_edited_params_are_400_too_deep(self, api, refund_approval, support_user):
        raw = b'{"user": "sam-support", "decision": "approved_with_edits", "edited_params": '
        raw += b'{"payment_id": ' + nested(100_000) + b"}}"
        status, data = api.post(f"/approvals/{refund_approval.pk}/decision", raw=raw)
        assert (status, data["error"]["code"]) == (400, "too_deep"), data
        assert ApprovalRequest.objects.get(pk=refund_approval.pk).status == "pending"

    def test_a_depth_just_under_the_limit_is_accepted(self, api):
        # The body is level 1 and `input` level 2: its contents may go 18 levels further.
        value: list = []
        for _ in range(MAX_JSON_DEPTH - 3):
            value = [value]
        status, data = api.post("/runs", {**start_body(), "input": {"order": "o", "x": value}})
        assert status == 201, data


# --------------------------------------------------------------------------------------------
# 7. A business key of another client: one answer, whatever matched


class TestBusinessKeyGuesses:
    def test_a_client_without_read_scope_gets_one_answer_whatever_it_guessed(self, api):
        status, _ = api.post("/runs", start_body(key="order-secret", order="o-secret"))
        assert status == 201
        _, credentials = ApiClient.issue("guesser", [ApiScope.RUNS_WRITE])
        guesser = Api(bearer(credentials.token))
        answers = []
        for body in (
            start_body(key="order-secret", order="o-secret"),  # the right input
            start_body(key="order-secret", order="o-wrong"),  # another input
            {**start_body(key="order-secret"), "workflow": "test.kb"},  # another workflow
        ):
            status, data = guesser.post("/runs", body)
            answers.append((status, data))
        assert answers[0][0] == 409
        assert answers[0] == answers[1] == answers[2]
        assert "run_id" not in answers[0][1]["error"]
        for word in ("input", "workflow", "client"):
            assert word not in answers[0][1]["error"]["message"]
        assert Run.objects.count() == 1

    def test_a_client_that_may_read_the_run_is_told_what_differs(self, api):
        _, first = api.post("/runs", start_body(key="order-7", order="o-7"))
        status, data = api.post("/runs", start_body(key="order-7", order="o-8"))
        assert (status, data["error"]["run_id"]) == (409, first["id"])
        assert "different input" in data["error"]["message"]


# --------------------------------------------------------------------------------------------
# 10. The schema states the rules the server enforces


class TestTheSchemaStatesTheRules:
    @pytest.fixture
    def document(self, api):
        status, document = api.get("/openapi.json")
        assert status == 200
        return document

    def validator(self, document, component):
        schema = {**document["components"]["schemas"][component],
                  "components": document["components"]}  # fmt: skip
        return jsonschema.Draft202012Validator(schema)

    @pytest.mark.parametrize("action", ["confirm_happened", "confirm_not_happened", "cancel"])
    def test_bulk_preview_needs_a_comment_for_settling_and_cancelling(self, document, action):
        preview = self.validator(document, "BulkPreviewIn")
        assert not preview.is_valid({"user": "sam", "action": action})
        assert not preview.is_valid({"user": "sam", "action": action, "comment": "  "})
        assert preview.is_valid({"user": "sam", "action": action, "comment": "outage"})
        assert preview.is_valid({"user": "sam", "action": "retry"})

    def test_bulk_preview_states_release_and_reassign_needs(self, document):
        preview = self.validator(document, "BulkPreviewIn")
        assert not preview.is_valid({"user": "sam", "action": "release"})
        assert preview.is_valid({"user": "sam", "action": "release", "needed_engineer": False})
        assert not preview.is_valid({"user": "sam", "action": "reassign"})
        assert not preview.is_valid({"user": "sam", "action": "reassign", "to": "a",
                                     "to_queue": "ops"})  # fmt: skip
        assert preview.is_valid({"user": "sam", "action": "reassign", "to_queue": "ops"})

    def test_bulk_preview_days_are_days_that_have_an_end(self, document):
        filters = self.validator(document, "BulkFiltersIn")
        for day in ("9999-12-31", "2026-02-30", "0000-01-01", "2026-13-01"):
            assert not filters.is_valid({"date_to": day}), day
        for day in ("", "2024-02-29", "9999-12-30", "0001-01-01"):
            assert filters.is_valid({"date_from": day}), day

    def test_bulk_preview_names_its_invalid_code(self, document):
        responses = document["paths"]["/api/v1/bulk-actions/preview"]["post"]["responses"]
        assert "`invalid`" in responses["422"]["description"]

    def test_nul_is_refused_in_filters_and_condition_values(self, document):
        filters = self.validator(document, "BulkFiltersIn")
        assert not filters.is_valid({"workflow": "a\u0000b"})
        condition = self.validator(document, "ConditionIn")
        assert not condition.is_valid({"param": "currency", "op": "==", "value": "EU\u0000R"})
        assert not condition.is_valid({"param": "currency", "op": "in", "value": ["\u0000"]})
        assert condition.is_valid({"param": "currency", "op": "in", "value": ["EUR"]})

    def test_the_readable_docs_page_shows_the_pattern_as_escapes(self, api):
        # The pattern lists the characters it refuses; the page must not carry them to a reader.
        from runs.invisible import first_forbidden_in_identifier

        response = api.http.get("/api/v1/docs")
        assert response.status_code == 200
        page = response.content.decode()
        assert first_forbidden_in_identifier(re.sub(r"[\t\n\r]", "", page)) is None
        assert "\\u202e" in page and "\\u3164" in page
