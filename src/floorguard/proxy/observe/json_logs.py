"""`log_format: json`: `serve`'s log lines as JSON objects, one a line, for a log collector —
the same records as the text format, never wrapped, with the exception's traceback as a
field where there is one."""

from __future__ import annotations

import json
import logging
import sys

__all__ = ["JsonLines", "use_json_logs"]


class JsonLines(logging.Formatter):
    """A record as `{"t", "level", "logger", "message"[, "exception"]}`."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "t": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def use_json_logs(level: int = logging.INFO) -> logging.Logger:
    """Every record to stderr as JSON lines; the start-up report's logger (`floorguard`,
    to stdout, where a program reads where the guard listens) returned."""
    errors = logging.StreamHandler(sys.stderr)
    errors.setFormatter(JsonLines())
    logging.basicConfig(level=level, handlers=[errors], force=True)
    report = logging.getLogger("floorguard.start")
    out = logging.StreamHandler(sys.stdout)
    out.setFormatter(JsonLines())
    report.addHandler(out)
    report.propagate = False
    return report
