"""The suite's xdist groups hold: under `pytest -n --dist loadgroup` a test marked with a group runs on
the worker that group was given (the Ray tests share one Ray instance; the tests of a module-scoped
fixture share one build of it, tests/conftest.py). xdist marks the group in the test's node id; a pytest
whose node ids it cannot mark spreads the group over the workers."""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite-groups")
def test_a_grouped_test_carries_its_group_under_loadgroup(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("xdist_group").args == ("suite-groups",)
    if getattr(request.config.option, "loadgroup", False):  # set in xdist's workers under loadgroup
        assert request.node.nodeid.endswith("@suite-groups"), (
            f"pytest-xdist --dist loadgroup ignored the test's group under pytest {pytest.__version__}: "
            "install the versions pyproject.toml's dev extra names"
        )


def test_a_module_fixtures_tests_share_a_group(request: pytest.FixtureRequest, shared_build: int) -> None:
    """tests/conftest.py puts the tests that use a module-scoped fixture of their own module in one
    group named after the module."""
    assert shared_build == 1
    marks = [m.args for m in request.node.iter_markers("xdist_group")]
    assert marks == [("tests/test_suite_groups.py",)]
    if getattr(request.config.option, "loadgroup", False):
        assert request.node.nodeid.endswith("@tests/test_suite_groups.py")


def test_a_test_without_a_module_fixture_is_not_grouped(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("xdist_group") is None


@pytest.fixture(scope="module")
def shared_build() -> int:
    return 1
