from __future__ import annotations

import re
import threading

import pytest
from django.db import IntegrityError, connection, connections, transaction

from runs.audit import verify_chain
from runs.models import (
    ConcurrentUpdate,
    ImmutableRecord,
    InvalidTransition,
    Lease,
    Run,
    SideEffect,
    Snapshot,
    Step,
    TimelineEvent,
    TransitionError,
)
from tests.dbroles import as_owner
from tests.factories import (
    RunFactory,
    SideEffectFactory,
    SnapshotFactory,
    StepFactory,
    TimelineEventFactory,
)

pytestmark = pytest.mark.django_db


def _all_pairs(table):
    return [(src, dst) for src, targets in table.items() for dst in sorted(targets)]


def _forbidden_pairs(table, statuses):
    return [(s, d) for s in statuses for d in statuses if d not in table[s] and s != d]


class TestConstraints:
    def test_duplicate_idempotency_key_is_refused_by_postgres(self):
        effect = SideEffectFactory()
        snapshot = SnapshotFactory(idempotency_key=effect.idempotency_key)
        with pytest.raises(IntegrityError), transaction.atomic():
            SideEffect.objects.create(
                idempotency_key=effect.idempotency_key,
                run=snapshot.run,
                step=snapshot.step,
                snapshot=snapshot,
                tool="mail.send",
                params_checksum="x",
            )

    @pytest.mark.parametrize(
        "table",
        ["runs_run", "runs_step", "runs_sideeffect", "runs_wait", "approvals_approvalrequest"],
    )
    def test_invalid_status_is_rejected_by_a_check_constraint(self, table):
        if table == "runs_wait":
            from tests.factories import WaitFactory

            pk = WaitFactory().pk
        elif table == "approvals_approvalrequest":
            from tests.factories import ApprovalRequestFactory

            pk = ApprovalRequestFactory().pk
        else:
            pk = {
                "runs_run": RunFactory,
                "runs_step": StepFactory,
                "runs_sideeffect": SideEffectFactory,
            }[table]().pk
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"UPDATE {table} SET status = 'bogus' WHERE id = %s", [pk])

    def test_each_status_domain_allows_exactly_its_fields_choices(self):
        # A choice added in code needs a migration that changes the domain's CHECK
        # (runs.models.ChoicesField): until then the database refuses it.
        from django.apps import apps

        from runs.models import ChoicesField

        fields = [
            field
            for model in apps.get_models()
            for field in model._meta.concrete_fields
            if isinstance(field, ChoicesField)
        ]
        assert {f.domain for f in fields} == {
            "runs_run_status",
            "runs_step_status",
            "runs_step_kind",
            "runs_side_effect_status",
        }
        with connection.cursor() as cursor:
            for field in fields:
                cursor.execute(
                    "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c "
                    "JOIN pg_type t ON t.oid = c.contypid WHERE t.typname = %s",
                    [field.domain],
                )
                (definition,) = cursor.fetchone()
                allowed = set(re.findall(r"'([a-z_]+)'", definition))
                assert allowed == {value for value, _ in field.choices}, field
                cursor.execute(
                    "SELECT data_type, domain_name FROM information_schema.columns "
                    "WHERE table_name = %s AND column_name = %s",
                    [field.model._meta.db_table, field.column],
                )
                assert cursor.fetchone()[1] == field.domain, field

    def test_step_name_and_iteration_are_unique_per_run(self):
        step = StepFactory(name="send", iteration=0)
        with pytest.raises(IntegrityError), transaction.atomic():
            StepFactory(run=step.run, name="send", iteration=0)
        StepFactory(run=step.run, name="send", iteration=1)  # the next iteration is fine


class TestRunTransitions:
    @pytest.mark.parametrize(("source", "target"), _all_pairs(Run.TRANSITIONS))
    def test_every_allowed_transition(self, source, target):
        run = RunFactory(status=source)
        run._move(target, "test.move")
        run.refresh_from_db()
        assert run.status == target
        assert run.lock_version == 1
        assert run.events.get().data == {"from": source, "to": target}
        if target in Run.TERMINAL:
            assert run.finished_at is not None

    @pytest.mark.parametrize(
        ("source", "target"),
        _forbidden_pairs(Run.TRANSITIONS, Run.Status.values)[::4],  # a sample, every 4th pair
    )
    def test_forbidden_transitions_raise_and_change_nothing(self, source, target):
        run = RunFactory(status=source)
        with pytest.raises(InvalidTransition):
            run._move(target, "test.move")
        run.refresh_from_db()
        assert run.status == source
        assert not run.events.exists()

    def test_a_stale_version_loses(self):
        run = RunFactory(status=Run.Status.NEEDS_HUMAN)
        run.cancel("first", expected_version=0)
        stale = RunFactory.build(pk=run.pk, status=Run.Status.NEEDS_HUMAN)
        with pytest.raises(TransitionError):
            stale.cancel("second", expected_version=0)


class TestStepAndSideEffectTransitions:
    @pytest.mark.parametrize(("source", "target"), _all_pairs(Step.TRANSITIONS))
    def test_every_allowed_step_transition(self, source, target):
        step = StepFactory(status=source)
        step._move(target, "test.step")
        step.refresh_from_db()
        assert step.status == target
        assert step.run.events.get().verb == "test.step"

    @pytest.mark.parametrize(
        ("source", "target"), _forbidden_pairs(Step.TRANSITIONS, Step.Status.values)[::5]
    )
    def test_forbidden_step_transitions_raise(self, source, target):
        step = StepFactory(status=source)
        with pytest.raises(InvalidTransition):
            step._move(target, "test.step")

    def test_a_worker_that_lost_its_lease_cannot_record(self):
        step = StepFactory(status=Step.Status.RUNNING, lease_owner="worker-b", attempts=2)
        with pytest.raises(ConcurrentUpdate):
            step.succeed({}, held_by=Lease("worker-a", 2))

    def test_an_earlier_attempt_of_the_same_worker_cannot_record(self):
        # Two threads of one process share the worker's name: the attempt fences the older one.
        step = StepFactory(status=Step.Status.RUNNING, lease_owner="worker-a", attempts=3)
        with pytest.raises(ConcurrentUpdate):
            step.succeed({}, held_by=Lease("worker-a", 2))
        step.succeed({}, held_by=Lease("worker-a", 3))
        step.refresh_from_db()
        assert step.status == Step.Status.SUCCEEDED

    @pytest.mark.parametrize(("source", "target"), _all_pairs(SideEffect.TRANSITIONS))
    def test_every_allowed_side_effect_transition(self, source, target):
        effect = SideEffectFactory(status=source)
        effect._move(target, "test.effect")
        effect.refresh_from_db()
        assert effect.status == target

    @pytest.mark.parametrize(
        ("source", "target"),
        [("committed", "intended"), ("committed", "unknown"), ("compensated", "committed"),
         ("unknown", "intended"), ("not_committed", "committed")],
    )  # fmt: skip
    def test_forbidden_side_effect_transitions_raise(self, source, target):
        effect = SideEffectFactory(status=source)
        with pytest.raises(InvalidTransition):
            effect._move(target, "test.effect")


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_transitions_exactly_one_wins():
    # Both threads read the run as pending and race to claim it; the conditional update lets
    # exactly one through, and the loser gets an error instead of silently overwriting.
    run = RunFactory(status=Run.Status.PENDING)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def attempt():
        try:
            mine = Run.objects.get(pk=run.pk)
            barrier.wait()
            mine.start()
            outcomes.append("won")
        except TransitionError:
            outcomes.append("lost")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["lost", "won"]
    assert Run.objects.get(pk=run.pk).events.filter(verb="run.started").count() == 1


class TestImmutability:
    def test_snapshot_cannot_be_saved_twice(self):
        snapshot = SnapshotFactory()
        snapshot.params = {"to": "someone-else@example.com"}
        with pytest.raises(ImmutableRecord):
            snapshot.save()
        with pytest.raises(ImmutableRecord):
            Snapshot.objects.filter(pk=snapshot.pk).update(tool="x")
        with pytest.raises(ImmutableRecord):
            snapshot.delete()

    def test_snapshot_checksum_covers_its_content(self):
        snapshot = SnapshotFactory()
        assert snapshot.checksum == snapshot.compute_checksum()
        assert len(snapshot.checksum) == 64

    @pytest.mark.parametrize("table", ["runs_snapshot", "runs_timelineevent"])
    def test_the_database_refuses_raw_updates_and_deletes(self, table):
        pk = SnapshotFactory().pk if table == "runs_snapshot" else TimelineEventFactory().pk
        column = "tool" if table == "runs_snapshot" else "verb"
        # As the owner: the application's role may not even try (tests/runs/test_app_role.py).
        for sql in (
            f"UPDATE {table} SET {column} = 'x' WHERE id = %s",
            f"DELETE FROM {table} WHERE id = %s",
        ):
            with (
                as_owner(),
                pytest.raises(IntegrityError, match="append-only"),
                transaction.atomic(),
                connection.cursor() as cursor,
            ):
                cursor.execute(sql, [pk])

    def test_the_database_refuses_to_delete_a_run(self):
        # The timeline has no foreign key to its run (the hot path writes an event per state
        # change): a trigger keeps what the key kept, every run's timeline with its run.
        run = RunFactory()
        run.record("test.step", {})
        with (
            as_owner(),
            pytest.raises(IntegrityError, match="never deleted"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute("DELETE FROM runs_run WHERE id = %s", [run.pk])
        assert Run.objects.filter(pk=run.pk).exists()

    def test_timeline_event_cannot_be_changed_through_the_orm(self):
        event = TimelineEventFactory()
        event.verb = "rewritten"
        with pytest.raises(ImmutableRecord):
            event.save()
        with pytest.raises(ImmutableRecord):
            TimelineEvent.objects.all().delete()


class TestTimelineChain:
    def test_events_form_a_verifiable_chain(self):
        run = RunFactory()
        for n in range(5):
            run.record("test.step", {"n": n, "text": "naïve ✓"})
        events = list(run.events.order_by("seq"))
        assert [e.seq for e in events] == [1, 2, 3, 4, 5]
        assert events[0].prev_hash == ""
        assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:], strict=False))
        assert verify_chain(events) == (True, "ok")
        run.refresh_from_db()
        assert (run.event_seq, run.event_hash) == (5, events[-1].hash)

    def test_a_gap_or_an_edit_is_named(self):
        run = RunFactory()
        for n in range(3):
            run.record("test.step", {"n": n})
        events = list(run.events.order_by("seq"))
        ok, message = verify_chain([events[0], events[2]])
        assert not ok and "seq 3" in message
        events[1].data = {"n": 99}
        ok, message = verify_chain(events)
        assert not ok and "seq 2" in message
