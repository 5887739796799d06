"""KFP's cron expressions: parsed as its scheduler parses them, and their next fire times.

KFP's ScheduledWorkflow controller reads a six-field cron, seconds first, in UTC, with the Go library
robfig/cron (v3): ``*`` and ``?`` mean every value (``?`` only in day-of-month and day-of-week), ``a-b``
ranges, ``x/n`` steps (``x`` alone runs to the field's end), comma lists, month and weekday names.
When both day fields are restricted a day matches either, as in classic cron; when one is ``*``/``?``
(an unstepped star) both must match. The library looks five years ahead and gives up: a cron that never
fires in that span (``0 0 3 31 2 *``, 31 February) makes a recurring run that never starts, so
:func:`next_fire_times` refuses it before anything is sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from g2rpo.errors import G2RPOError, problem

__all__ = ["Cron", "SEARCH_YEARS", "next_fire_times", "parse_cron"]

SEARCH_YEARS = 5  # how far robfig/cron's Next looks before it gives up
_MONTHS = {m: i + 1 for i, m in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {d: i for i, d in enumerate("SUN MON TUE WED THU FRI SAT".split())}
# (label, lowest, highest, names)
_FIELDS = (
    ("seconds", 0, 59, {}),
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_ITEM = re.compile(r"^(\*|\?|[0-9A-Za-z]+(?:-[0-9A-Za-z]+)?)(?:/([0-9]+))?$")
_FIX = "six fields, seconds first, in UTC: e.g. '0 0 3 * * *' (03:00 UTC daily)"


@dataclass(frozen=True)
class Cron:
    """A parsed six-field cron: the allowed values of each field, and whether each day field is a star."""

    expression: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    days_star: bool
    weekdays_star: bool

    def fires_on(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month, in_week = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return in_month and in_week
        return in_month or in_week


def parse_cron(expression: str) -> Cron:
    """Parse a six-field cron the way KFP's scheduler does; a G2RPOError names the field and the fix."""
    fields = expression.split()
    if len(fields) != 6:
        raise G2RPOError(problem("cron", expression, f"has {len(fields)} fields; write {_FIX}"))
    parsed, stars = [], []
    for text, (label, low, high, names) in zip(fields, _FIELDS, strict=True):
        values: set[int] = set()
        star = False
        for item in text.split(","):
            match = _ITEM.match(item)
            if not match:
                raise G2RPOError(problem("cron", expression, f"{label} field {text!r} is not valid; write {_FIX}"))
            span, step_text = match.group(1), match.group(2)
            if span == "?" and label not in ("day of month", "day of week"):
                raise G2RPOError(
                    problem("cron", expression, f"'?' is only for day of month or day of week, not {label}; use '*'")
                )
            step = int(step_text) if step_text is not None else 1
            if step < 1:
                raise G2RPOError(problem("cron", expression, f"{label} step '/{step_text}' must be at least 1"))
            if span in ("*", "?"):
                first, last = low, high
                star = star or step == 1
            else:
                bounds = [_value(expression, label, part, low, high, names) for part in span.split("-")]
                first, last = bounds[0], bounds[-1] if len(bounds) == 2 else (high if step_text else bounds[0])
                if first > last:
                    raise G2RPOError(problem("cron", expression, f"{label} range {span!r} runs backwards"))
            values.update(range(first, last + 1, step))
        parsed.append(frozenset(values))
        stars.append(star)
    return Cron(" ".join(fields), *parsed, days_star=stars[3], weekdays_star=stars[5])


def _value(expression: str, label: str, part: str, low: int, high: int, names: dict[str, int]) -> int:
    number = int(part) if part.isdigit() else names.get(part.upper())
    if number is None or not low <= number <= high:
        raise G2RPOError(problem("cron", expression, f"{label} {part!r} is outside {low}-{high}; write {_FIX}"))
    return number


def next_fire_times(expression: str, after: datetime, count: int = 3) -> list[datetime]:
    """The next ``count`` times (UTC) after ``after`` that the cron fires at; a G2RPOError when it never
    fires within :data:`SEARCH_YEARS` years (the scheduler would never start a run)."""
    cron = parse_cron(expression)
    after = after.astimezone(UTC)
    times: list[datetime] = []
    day, end = after.date(), after.date() + timedelta(days=366 * SEARCH_YEARS)
    clock = sorted((h, m, s) for h in cron.hours for m in cron.minutes for s in cron.seconds)
    while day <= end and len(times) < count:
        if cron.fires_on(day):
            for h, m, s in clock:
                at = datetime(day.year, day.month, day.day, h, m, s, tzinfo=UTC)
                if at > after:
                    times.append(at)
                    if len(times) == count:
                        break
        day += timedelta(days=1)
    if not times:
        raise G2RPOError(
            problem(
                "cron",
                expression,
                f"never fires (no such day within {SEARCH_YEARS} years, e.g. 31 February): KFP would keep a "
                f"recurring run that never starts; write {_FIX}",
            )
        )
    return times
