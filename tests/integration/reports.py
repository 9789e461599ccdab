"""Reading the REPORT lines that tests/fixtures/report.py prints."""

from __future__ import annotations

import json


def reports(output: str) -> list[dict]:
    return [json.loads(line.split("REPORT ", 1)[1]) for line in output.splitlines() if "REPORT " in line]
