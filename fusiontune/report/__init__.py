"""Reports: the study's trials as a pandas table, markdown / HTML with plots, the recommendation.

Everything is built from the study's optuna storage alone (``fusiontune report`` rebuilds it).
"""

from fusiontune.report.build import (
    Recommendation,
    build_report,
    choose_recommendation,
    report_command,
)
from fusiontune.report.tables import format_top, load_study_frame, pareto_front, pass_effect, ranked

__all__ = [
    "Recommendation",
    "build_report",
    "choose_recommendation",
    "format_top",
    "load_study_frame",
    "pareto_front",
    "pass_effect",
    "ranked",
    "report_command",
]
