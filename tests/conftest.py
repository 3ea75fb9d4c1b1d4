import pytest

import duckmob


@pytest.fixture
def con():
    c = duckmob.connect()
    yield c
    c.close()
