"""Sealed records: rows outside the timeline whose content a hash chain vouches for.

What people decided lives in ordinary tables the application writes: decisions, takeovers,
approval requests, rule versions and the rules they describe, tool pauses, decisions over
tools' metadata, bulk jobs and their items (approvals/models), and the ledger rows a person
settled. Each such row is *sealed*: the transaction that writes or changes it appends a seal,

    {"model": "approvals.humandecision", "id": 12,
     "digest": sha256(canonical_json(content)),
     "fields": {"comment": <sha256(canonical_json(value)), first 16 hex digits>, ...}}

where `content` is {column: value} over the columns the seal names: every concrete column of
the model but its primary key and the few its Spec leaves out, each for a stated reason
(values as plain JSON: times in UTC ISO 8601 with microseconds, decimals and ids as text). A
row of one run is sealed on that run's timeline (a `record.sealed` event); a row that belongs
to no run on the records chain (approvals.models.records), hash-chained and headed as a run's
timeline is. The latest seal of a row must match the row as it is now: `verify_audit` (and
`--file`, from an export's record lines) recomputes the content over the columns the seal
names and says which row, which seal and which columns; a row that must carry a seal and has
none, and a seal whose row is gone, are named too. A seal names its columns, so a column
added to a model later is covered from the row's next seal on, and older seals still verify.

Seals are written by the models' own verbs: SealedModel seals every row it inserts, and the
verbs that change a sealed row seal it again. The digest is of the row read back from the
database, so it is of exactly what PostgreSQL holds (a JSON number or a time as stored): one
SELECT and one INSERT per seal, never on the engine's hot path.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps as django_apps
from django.db import models, transaction
from django.db.models import Q

from runs.models import ImmutableRecord, SideEffectStatus, TimelineEvent, digest
from runs.verbs import Verb

SEALED = Verb.RECORD_SEALED
# What a seal keeps of each column's digest: enough to say which columns changed (the digest of
# the whole content is the proof).
FIELD_DIGEST_CHARS = 16
# The chain of the rows that belong to no run, where a run's id would be.
RECORDS = "records"

GetModel = Callable[[str], type[models.Model]]
# A model's computed entries, by primary key (a bulk job's frozen list of items).
Extra = Callable[[GetModel, list[Any]], dict[Any, dict[str, Any]]]


@dataclass(frozen=True)
class Spec:
    """What the seals of one model cover, and which of its rows must carry one."""

    label: str  # app_label.modelname, as in the seal
    run: str | None = "run_id"  # the column naming the row's run; None: the records chain
    exclude: frozenset[str] = frozenset()  # columns left out (each Spec says why)
    required: Q | None = None  # the rows that must be sealed (None: every row)
    coarse: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)
    extra: Extra | None = None
    extra_names: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.label.split(".", 1)[1]

    def columns(self, model: type[models.Model]) -> list[str]:
        return [
            f.attname
            for f in model._meta.concrete_fields
            if not f.primary_key and f.attname not in self.exclude
        ]


@dataclass(frozen=True)
class Row:
    """A sealed model's row as a seal sees it: its chain (run id or RECORDS) and content."""

    label: str
    pk: Any
    chain: str
    content: dict[str, Any]


@dataclass(frozen=True)
class Seal:
    seq: int
    label: str
    pk: Any
    digest: str
    fields: dict[str, str]


@dataclass(frozen=True)
class Pair:
    """A row and the latest seal of it (either may be missing: that is what a check names)."""

    label: str
    pk: Any
    chain: str  # the chain that sealed it, or the row's own when it has no seal
    row: Row | None
    seal: Seal | None


@dataclass(frozen=True)
class Finding:
    chain: str
    message: str


_SPECS: dict[str, Spec] = {}
_records_chain: Any = None


def register(spec: Spec) -> None:
    _SPECS[spec.label] = spec


def specs() -> list[Spec]:
    return list(_SPECS.values())


def spec_of(model: type[models.Model]) -> Spec | None:
    return _SPECS.get(model._meta.label_lower)


def use_records_chain(model) -> None:
    """The model of the records chain (approvals.models.records.AuditRecord): `append(verb,
    data)`, `head()` and the timeline's columns."""
    global _records_chain
    _records_chain = model


def records_chain():
    return _records_chain


# --------------------------------------------------------------------------------------------
# Content


def plain(value: Any) -> Any:
    """A column's value as a seal hashes it: plain JSON, times in UTC with microseconds."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def short(value: Any) -> str:
    return digest(value)[:FIELD_DIGEST_CHARS]


def seal_data(row: Row) -> dict[str, Any]:
    return {
        "model": row.label,
        "id": row.pk,
        "digest": digest(row.content),
        "fields": {name: short(value) for name, value in row.content.items()},
    }


def read(
    spec: Spec, model: type[models.Model], where: Q, get_model: GetModel | None = None
) -> dict[Any, Row]:
    """The rows of `model` matching `where`, by primary key, as seals see them."""
    columns = spec.columns(model)
    values = list(model._base_manager.filter(where).order_by().values("pk", *columns))
    extras: dict[Any, dict[str, Any]] = {}
    if spec.extra is not None and values:
        extras = spec.extra(get_model or django_apps.get_model, [v["pk"] for v in values])
    rows = {}
    for value in values:
        pk = value.pop("pk")
        chain = str(value[spec.run]) if spec.run else RECORDS
        content = {
            name: plain(spec.coarse[name](value[name]) if name in spec.coarse else value[name])
            for name in columns
        }
        for name in spec.extra_names:
            content[name] = plain(extras.get(pk, {}).get(name))
        rows[pk] = Row(spec.label, pk, chain, content)
    return rows


# --------------------------------------------------------------------------------------------
# Writing seals


def seal(obj: models.Model) -> None:
    """Seal `obj`'s row as the database holds it now (inside the transaction that wrote it)."""
    seal_rows(type(obj), [obj.pk])


def seal_rows(
    model: type[models.Model], pks: Iterable[Any], *, get_model: GetModel | None = None
) -> int:
    """Seal these rows of `model`, in the order given: each on its run's timeline, or on the
    records chain. Works on a migration's historical models too (`get_model`)."""
    pks = list(dict.fromkeys(pks))
    spec = _SPECS.get(model._meta.label_lower)
    if spec is None:
        raise LookupError(f"{model._meta.label_lower} rows are not sealed (no runs.seal.Spec)")
    if not pks:
        return 0
    rows = read(spec, model, Q(pk__in=pks), get_model)
    with transaction.atomic(savepoint=False):
        for pk in pks:
            row = rows.get(pk)
            if row is None:
                raise model.DoesNotExist(f"{spec.name} {pk}")
            if spec.run:
                TimelineEvent.append(row.chain, SEALED, seal_data(row))
            else:
                _records_chain.append(SEALED, seal_data(row))
    return len(pks)


class SealedModel(models.Model):
    """A model whose rows are sealed: every row it inserts is sealed in the inserting
    transaction (`objects.create` and `save` of a new row); the verbs that change a row seal it
    again. With `append_only`, saving a row that exists is refused (so is UPDATE, by the
    database's trigger)."""

    append_only = False

    class Meta:
        abstract = True

    def save(self, *args, **kwargs):
        adding = self._state.adding
        if not adding and self.append_only:
            raise ImmutableRecord(f"{type(self).__name__} {self.pk} cannot be changed")
        with transaction.atomic(savepoint=False):
            super().save(*args, **kwargs)
            if adding:
                seal(self)


def backfill(get_model: GetModel) -> int:
    """Seal every row of a sealed model that has no seal yet (a migration's RunPython: rows
    written before seals existed are sealed as they are found then)."""
    sealed: set[tuple[str, Any]] = set()
    events = TimelineEvent.objects.filter(verb=SEALED).values_list("data", flat=True)
    chain = get_model(_records_chain._meta.label) if _records_chain is not None else None
    records = chain.objects.filter(verb=SEALED).values_list("data", flat=True) if chain else []
    for data in [*events.iterator(), *records]:
        if isinstance(data, dict):
            sealed.add((data.get("model"), data.get("id")))
    count = 0
    for spec in specs():
        model = get_model(spec.label)
        pks = (
            model._base_manager.filter(_must_be_sealed(spec))
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        todo = [pk for pk in pks if (spec.label, pk) not in sealed]
        count += seal_rows(model, todo, get_model=get_model)
    return count


# --------------------------------------------------------------------------------------------
# Checking seals


def _must_be_sealed(spec: Spec) -> Q:
    # Never an empty Q: `Q() | Q(pk__in=...)` would be the second one alone.
    return spec.required if spec.required is not None else Q(pk__isnull=False)


def read_seal(seq: int, data: Any) -> Seal | None:
    """The seal a `record.sealed` event (or records chain entry) carries; None if malformed."""
    if not isinstance(data, dict):
        return None
    label, dig, fields = data.get("model"), data.get("digest"), data.get("fields")
    if not (isinstance(label, str) and isinstance(dig, str) and isinstance(fields, dict)):
        return None
    return Seal(seq, label, data.get("id"), dig, fields)


def compare(pair: Pair) -> Finding | None:
    """What is wrong with a row and its latest seal, if anything."""
    name = pair.label.split(".", 1)[-1]
    row, found = pair.row, pair.seal
    if found is None:
        return Finding(
            pair.chain,
            f"{name} {pair.pk} has no seal (it was written or changed outside the verbs that "
            "seal it)",
        )
    where = f"its seal at seq {found.seq}"
    if row is None:
        return Finding(
            pair.chain, f"{name} {pair.pk} is sealed at seq {found.seq}, but its row is missing"
        )
    missing = [n for n in found.fields if n not in row.content]
    if missing:
        return Finding(
            pair.chain,
            f"{name} {pair.pk} cannot be checked against {where}: it has no {', '.join(missing)}",
        )
    content = {n: row.content[n] for n in found.fields}
    if digest(content) == found.digest:
        return None
    changed = sorted(n for n in found.fields if short(content[n]) != found.fields[n])
    return Finding(
        pair.chain,
        f"{name} {pair.pk} does not match {where} ({', '.join(changed) or 'content'} changed)",
    )


def _pairs(sealed: dict[tuple[str, Any], tuple[str, Seal]], rows: Iterable[Row]) -> list[Pair]:
    """Match rows with their seals (popped from `sealed`); what is left are seals of gone
    rows. Rows without a seal are those that must carry one."""
    pairs = []
    for row in rows:
        hit = sealed.pop((row.label, row.pk), None)
        chain, found = hit if hit else (row.chain, None)
        pairs.append(Pair(row.label, row.pk, chain, row, found))
    return pairs


def run_pairs(seals_by_run: Mapping[str, Mapping[tuple[str, Any], Seal]]) -> list[Pair]:
    """Every sealed row of these runs with its latest seal: the rows that must be sealed, and
    the rows (wherever they are now) that these runs' chains sealed."""
    sealed = {
        key: (str(run), found)
        for run, seals in seals_by_run.items()
        for key, found in seals.items()
    }
    run_ids = list(seals_by_run)
    pairs: list[Pair] = []
    for spec in specs():
        if spec.run is None:
            continue
        model = django_apps.get_model(spec.label)
        pks = [pk for label, pk in sealed if label == spec.label]
        where = Q(**{f"{spec.run}__in": run_ids}) & _must_be_sealed(spec)
        pairs += _pairs(sealed, read(spec, model, where | Q(pk__in=pks)).values())
    pairs += [Pair(k[0], k[1], chain, None, found) for k, (chain, found) in sealed.items()]
    return pairs


def record_pairs(seals: Mapping[tuple[str, Any], Seal]) -> list[Pair]:
    """Every row sealed on the records chain, or that must be, with its latest seal."""
    sealed = {key: (RECORDS, found) for key, found in seals.items()}
    pairs: list[Pair] = []
    for spec in specs():
        if spec.run is not None:
            continue
        model = django_apps.get_model(spec.label)
        pks = [pk for label, pk in sealed if label == spec.label]
        where = _must_be_sealed(spec) | Q(pk__in=pks)
        pairs += _pairs(sealed, read(spec, model, where).values())
    pairs += [Pair(k[0], k[1], chain, None, found) for k, (chain, found) in sealed.items()]
    return pairs


def first_findings(pairs: Iterable[Pair]) -> dict[str, Finding]:
    """The first finding of each chain: the one of the earliest seal, then unsealed rows."""
    found: dict[str, tuple[tuple, Finding]] = {}
    for pair in pairs:
        finding = compare(pair)
        if finding is None:
            continue
        order = (pair.seal is None, pair.seal.seq if pair.seal else 0, str(pair.pk))
        if finding.chain not in found or order < found[finding.chain][0]:
            found[finding.chain] = (order, finding)
    return {chain: finding for chain, (_order, finding) in found.items()}


# --------------------------------------------------------------------------------------------
# The core's own sealed rows: a ledger row a person settled


def _settled(status: str) -> str:
    # A committed effect may be compensated later (its own events record that): the seal
    # covers "committed" either way.
    return SideEffectStatus.COMMITTED if status == SideEffectStatus.COMPENSATED else status


register(
    Spec(
        "runs.sideeffect",
        # updated_at moves with every change; compensation_key is set when the effect is
        # undone (side_effect.compensated records it).
        exclude=frozenset({"updated_at", "compensation_key"}),
        required=Q(
            confirmed_by__startswith="user:",
            status__in=[SideEffectStatus.COMMITTED, SideEffectStatus.COMPENSATED],
        ),
        coarse={"status": _settled},
    )
)
