"""Fixtures that several test modules share (pytest loads this file before them, with this folder
on sys.path)."""
from __future__ import annotations

import pytest

from lf_testdb import tiny_train_db


@pytest.fixture(scope="module")
def train_db(tmp_path_factory):
    """The trainer tests' tiny packed DB (lf_testdb.tiny_train_db), built once per test module."""
    return tiny_train_db(tmp_path_factory.mktemp("db"))
