import pytest

from .front_ends import front_end


@pytest.fixture(params=["keras2", "keras3"])
def fe(request):
    """Each test taking `fe` runs once per front end (tf-keras, Keras 3)."""
    return front_end(request.param)
