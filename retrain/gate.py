"""The promotion gate: a candidate is promoted only if it is not worse than the champion beyond a
tolerance on **any** measure — so a better GAUC cannot buy a broken calibration, and an AUC on uniform
negatives (which rewards popularity) cannot buy worse recall, overall or of the long tail.

The long tail is judged by what recall *finds*: HR@k on the holdout behaviours whose item is in the
long tail. The share of tail items among the recalled ones is reported but not gated: it rewards
noise (a model that recalls arbitrary unpopular items scores high on it), and serving sets the tail
share of what users see with its own lane (DINREC_TAIL_SHARE) — what a model must not lose is the
ability to put the right tail items among the candidates. On amazon-hin a warm-started candidate
recalled a smaller tail share than the champion (0.477 vs 0.549) while finding the held-out tail
behaviours as often (0.171 vs 0.166) and all behaviours more often (0.275 vs 0.240).

One measure is conditional. The holdout's negatives are uniform samples, not logged impressions, so
its calibration-in-the-large (mean predicted ÷ observed CTR) is an approximation: a far sharper model
can under- or over-shoot it while its logloss — calibration and resolution together — is clearly
better (a drifted-interest candidate: GAUC 0.92 vs 0.60, logloss 0.163 vs 0.191, mean ratio 0.53 vs
0.97). So a worse calibration error refuses a candidate unless its logloss is better than the
champion's by more than the logloss tolerance; a miscalibrated model that ranks the same (the
``miscalibrated`` drill) fails both.

Each check says what it compared; the report keeps every one, passed or not. Where the metric is a
mean over units (users for GAUC, rows for logloss, held-out behaviours for the HRs) the check also
carries the paired difference and its standard error, so a reader can tell a refusal by a clear
margin from one within noise (the decision does not use it: tolerances are absolute, the safe
direction on a small holdout is to keep the champion).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from dinrec.retrain.settings import RetrainSettings


@dataclass(frozen=True)
class Check:
    metric: str
    champion: float | None
    candidate: float
    limit: float  # the worst value that still passes
    higher_is_better: bool
    passed: bool
    note: str | None = None  # why a check beyond its limit still passed
    difference: float | None = None  # candidate − champion, paired over the holdout's units
    se: float | None = None  # its standard error

    def why(self) -> str:
        worse = "below" if self.higher_is_better else "above"
        base = f"champion {self.champion:.4f}" if self.champion is not None else ""
        if base and self.se is not None:  # compare.paired_differences gives none it cannot size
            base += f", difference {self.difference:+.4f} ± {self.se:.4f} s.e."
        said = f"{self.metric} {self.candidate:.4f} is {worse} the limit {self.limit:.4f}"
        return f"{said} ({base})" if base else said


def _check(metric: str, champion: float | None, candidate: float, limit: float, higher: bool) -> Check:
    if math.isnan(candidate):
        return Check(metric, champion, candidate, limit, higher, False)
    if math.isnan(limit):  # the champion's value is undefined on this holdout: nothing to be worse than
        return Check(metric, champion, candidate, limit, higher, True)
    return Check(metric, champion, candidate, limit, higher, bool(candidate >= limit if higher else candidate <= limit))


def _baseline_checks(candidate: dict, baselines: dict | None, s: RetrainSettings,
                     differences: dict[str, dict]) -> list[Check]:
    """The served list against each baseline's (compare.baselines): not below it by more than
    ``baseline_tolerance``, champion or not."""
    out = []
    for name, measured in (baselines or {}).items():
        check = _check(f"served_hr_vs_{name}", measured["served_hr"], candidate["served_hr"],
                       measured["served_hr"] - s.baseline_tolerance, True)
        paired = differences.get(f"served_hr_vs_{name}")
        out.append(replace(check, **paired) if paired else check)
    return out


def decide(candidate: dict, champion: dict | None, s: RetrainSettings,
           differences: dict[str, dict] | None = None, baselines: dict | None = None) -> tuple[bool, list[Check]]:
    """(promote?, the checks). Without a champion the candidate must reach ``min_gauc``; with or
    without one, its served list must hold against ``baselines`` (popularity, item-CF). ``differences``:
    compare.paired_differences, attached to the checks they belong to."""
    paired = differences or {}
    against = _baseline_checks(candidate, baselines, s, paired)
    if champion is None:
        checks = [_check("gauc", None, candidate["gauc"], s.min_gauc, True), *against]
        return all(c.passed for c in checks), checks
    checks = [
        _check("gauc", champion["gauc"], candidate["gauc"], champion["gauc"] - s.gauc_tolerance, True),
        _check("auc", champion["auc"], candidate["auc"], champion["auc"] - s.auc_tolerance, True),
        _check("logloss", champion["logloss"], candidate["logloss"],
               champion["logloss"] * (1 + s.logloss_tolerance), False),
        _calibration(candidate, champion, s),
        _check("recall_hr", champion["recall_hr"], candidate["recall_hr"],
               champion["recall_hr"] - s.recall_tolerance, True),
        _check("recall_tail_hr", champion["recall_tail_hr"], candidate["recall_tail_hr"],
               champion["recall_tail_hr"] - s.tail_tolerance, True),
    ]
    if "served_hr" in champion:  # champions measured before the served list was: nothing to compare
        checks.append(_check("served_hr", champion["served_hr"], candidate["served_hr"],
                             champion["served_hr"] - s.served_tolerance, True))
    checks = [replace(c, **paired[c.metric]) if c.metric in paired else c for c in checks]
    return all(c.passed for c in checks + against), checks + against


def _calibration(candidate: dict, champion: dict, s: RetrainSettings) -> Check:
    check = _check("calibration_error", champion["calibration_error"], candidate["calibration_error"],
                   champion["calibration_error"] + s.calibration_tolerance, False)
    better_logloss = candidate["logloss"] < champion["logloss"] * (1 - s.logloss_tolerance)
    if check.passed or not better_logloss:
        return check
    return Check(check.metric, check.champion, check.candidate, check.limit, False, True,
                 note=f"beyond the limit, but logloss {candidate['logloss']:.4f} is better than the champion's "
                      f"{champion['logloss']:.4f} by more than its tolerance")


def checks_json(checks: list[Check]) -> list[dict]:
    return [{**asdict(c), "limit": round(c.limit, 5), "why": None if c.passed else c.why()} for c in checks]
