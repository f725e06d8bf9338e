"""Fixtures of the GPU checks: ``figure`` records a number a check measured, for ``run_all.sh``'s report."""

import logging

import pytest

logger = logging.getLogger(__name__)


@pytest.fixture
def figure(record_property):
    """``figure(name, value)``: keep a measured number with the test's result (run_all.sh prints it on the check's
    line, from the JUnit report); returns ``value``."""

    def record(name: str, value: float) -> float:
        record_property(name, f"{float(value):.4g}")
        logger.info("%s = %.4g", name, value)
        return value

    return record
