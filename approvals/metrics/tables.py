"""The metrics tables: per-run figures, day and hour sums, counters."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models import (
    Run,
)


class MetricCounts(models.Model):
    """What the metrics dashboard adds up with sum(), for one run (RunMetrics), or the ended runs
    that started in one day (MetricsDay) or hour (MetricsHour): flags and tallies, and the tool
    tallies as three parallel arrays (tool, failure class or "" for attempts, count). See
    approvals.metrics for each column's definition.
    """

    runs = models.IntegerField()
    finished = models.IntegerField()
    succeeded = models.IntegerField()
    faulted_finished = models.IntegerField()
    auto_recovered = models.IntegerField()
    human_stepped_in = models.IntegerField()
    takeovers = models.IntegerField()
    runs_taken_over = models.IntegerField()
    second_intervention = models.IntegerField()
    failed_steps = models.IntegerField()
    recovered = models.IntegerField()
    recovered_locally = models.IntegerField()
    tool_calls = models.IntegerField()
    tool_failures = models.IntegerField()
    steps_committed = models.IntegerField()
    steps_duplicated = models.IntegerField()
    steps_resent = models.IntegerField()
    wrong_retries = models.IntegerField()
    committed = models.IntegerField()
    covered = models.IntegerField()
    snapshots = models.IntegerField()
    missing = models.IntegerField()
    settled = models.IntegerField()
    expired = models.IntegerField()
    decided = models.IntegerField()
    # Recoveries that went to a person because metadata was missing, by cause
    # (runs.models.RecoveryCause); takeover cost; duplicates after a resume.
    recovery_missing_workflow = models.IntegerField(default=0)
    recovery_missing_step = models.IntegerField(default=0)
    recovery_missing_wait = models.IntegerField(default=0)
    takeovers_ended = models.IntegerField(default=0)
    takeover_actions = models.IntegerField(default=0)
    takeovers_answered = models.IntegerField(default=0)
    takeovers_needing_engineer = models.IntegerField(default=0)
    resumes = models.IntegerField(default=0)
    resumes_with_duplicate = models.IntegerField(default=0)
    duplicates_after_resume = models.IntegerField(default=0)
    tool_names = ArrayField(models.TextField())
    tool_classes = ArrayField(models.TextField())
    tool_counts = ArrayField(models.IntegerField())

    class Meta:
        abstract = True


class MetricSums(MetricCounts):
    """A run's counts and every one of its durations (a few per run), by kind."""

    close_s = ArrayField(models.FloatField())
    recover_s = ArrayField(models.FloatField())
    resume_s = ArrayField(models.FloatField())
    handling_s = ArrayField(models.FloatField())
    latency_ms = ArrayField(models.FloatField())
    takeover_s = ArrayField(models.FloatField(), default=list)

    class Meta:
        abstract = True


class PeriodSums(MetricCounts):
    """The counts of a day's or an hour's ended runs, and their durations as a sketch: how many
    fell in each log bucket of 1 % (approvals/metrics/sketch.py), per kind of duration (its
    index in VALUE_FIELDS), as three parallel arrays sorted by kind and bucket. Sketches add up
    bucket by bucket, so a window's medians come from a few thousand counts, not from every
    duration."""

    sketch_kinds = ArrayField(models.SmallIntegerField())
    sketch_bins = ArrayField(models.IntegerField())
    sketch_counts = ArrayField(models.IntegerField())

    class Meta:
        abstract = True


SUM_FIELDS = [f.name for f in MetricCounts._meta.fields if isinstance(f, models.IntegerField)]
VALUE_FIELDS = ["close_s", "recover_s", "resume_s", "handling_s", "latency_ms", "takeover_s"]
TOOL_FIELDS = ["tool_names", "tool_classes", "tool_counts"]
SKETCH_FIELDS = ["sketch_kinds", "sketch_bins", "sketch_counts"]


class RunMetrics(MetricSums):
    """One run's figures, stored (`approvals.metrics.rollup`).

    An ended run never changes again and a parked one rarely does, so their figures are worked
    out once, after the run has been still for a minute (`manage.py rollup_metrics`, or the
    beat task), and the dashboard adds these rows up instead of re-reading the timeline. Runs
    without a current row (moving, or not rolled up yet) are computed live by the same SQL.
    """

    run = models.OneToOneField(Run, primary_key=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField()  # the run's, for the window
    finished_at = models.DateTimeField(null=True)  # the run's, for the rollup's high-water mark
    # The run's timeline head when this row was computed. Every change of a run appends an
    # event (principle 5), so a row whose event_seq is not the run's is stale and not used.
    event_seq = models.PositiveIntegerField()
    status = models.CharField(max_length=20)
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["created_at"], name="runmetrics_created_idx"),
            models.Index(fields=["finished_at"], name="runmetrics_finished_idx"),
            # Open runs' rows, which no day row sums.
            models.Index(
                fields=["created_at"], name="runmetrics_open_idx", condition=Q(finished=0)
            ),
        ]

    def __str__(self) -> str:
        return f"metrics of run {self.run_id}"


class MetricsDay(PeriodSums):
    """The sums of the stored rows of the runs that started on one day (in `tz`) and have ended.

    Rebuilt by the rollup in the same transaction as any row it stores for such a run, and
    when the day is over; the dashboard reads it for every whole past day of a window.
    """

    tz = models.CharField(max_length=64)
    day = models.DateField()
    computed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tz", "day"], name="metricsday_unique")]

    def __str__(self) -> str:
        return f"metrics of {self.day} ({self.tz})"


class MetricsHour(PeriodSums):
    """The same sums for the ended runs that started in one hour (`hour`, its start). The
    dashboard reads them for the whole past hours of a window that no day row covers: the 24 h
    window, and the first and last days of the others."""

    hour = models.DateTimeField(unique=True)
    computed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"metrics of the hour from {self.hour:%Y-%m-%d %H:%M} UTC"


class MetricsCounter(models.Model):
    """An all-time count behind /metrics, over the runs that ended before
    MetricsCounterMark.through: runs by workflow and final status, side effects committed and
    compensated by tool, failed tool attempts by tool and class. The rollup adds the runs that
    ended since, once each, and moves the mark; a scrape adds only what ended after it."""

    family = models.CharField(max_length=32)  # "runs", "committed", "compensated", "failures"
    name = models.CharField(max_length=200)  # the workflow or the tool
    detail = models.CharField(max_length=50, blank=True)  # the status or the failure class
    value = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["family", "name", "detail"], name="metricscounter_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.family}{{{self.name},{self.detail}}} = {self.value}"


class MetricsCounterMark(models.Model):
    """How far MetricsCounter has counted: every run that ended before `through` (one row)."""

    name = models.CharField(max_length=32, unique=True, default="counters")
    through = models.DateTimeField()
