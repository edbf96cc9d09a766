"""Fixtures the actor tests share."""

from tests.actors.publishing_fixtures import publishing

__all__ = ["publishing"]
