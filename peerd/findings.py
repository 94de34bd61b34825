"""What ``peerd doctor`` reports: findings, each with a status and, when something is wrong, a fix.

Invariants: every finding is ``ok``, ``warn``, ``fail`` or ``skip``; every ``fail`` and ``warn``
carries a fix; a report is healthy unless it holds a ``fail``. Plain values, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str
    subject: str
    detail: str
    fix: str | None = None


@dataclass
class Report:
    home: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(f.status == FAIL for f in self.findings)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for f in self.findings if f.status == s) for s in (OK, WARN, FAIL, SKIP)}

    def to_dict(self) -> dict[str, Any]:
        return {"home": self.home, "healthy": not self.failed, "counts": self.counts(),
                "findings": [asdict(f) for f in self.findings]}


def format_report(report: Report) -> str:
    marks = {OK: "ok  ", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}
    width = max((len(f.check) for f in report.findings), default=8)
    lines = [f"peerd doctor: {report.home}"]
    for f in report.findings:
        lines.append(f"  {marks[f.status]}  {f.check.ljust(width)}  {f.subject}: {f.detail}" if f.subject
                     else f"  {marks[f.status]}  {f.check.ljust(width)}  {f.detail}")
        if f.fix and f.status in (WARN, FAIL):
            lines.append(f"        {' ' * width}  fix: {f.fix}")
    c = report.counts()
    lines.append(f"{c[OK]} ok, {c[WARN]} warning(s), {c[FAIL]} problem(s)"
                 + (f", {c[SKIP]} skipped" if c[SKIP] else "")
                 + ("" if report.failed else " - nothing needs fixing" if not c[WARN] else ""))
    return "\n".join(lines)
