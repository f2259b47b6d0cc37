"""Typed errors keep their type, exact message and fields across Ray: raised in an actor, they
reach the caller as they were raised."""

from __future__ import annotations

import pickle

import pytest
import ray

from scopecast.actors import errors
from scopecast.actors.errors import ScopecastError, TopicNotFound, typed_cause


def _every_error() -> list[ScopecastError]:
    out: list[ScopecastError] = []
    todo = [ScopecastError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        out.append(TopicNotFound("penguins") if cls is TopicNotFound
                   else cls(f"{cls.__name__} happened: do this"))
    return out


def _same(a: BaseException, b: BaseException) -> bool:
    return type(a) is type(b) and str(a) == str(b) and vars(a) == vars(b)


def test_every_error_type_pickles_to_itself():
    made = _every_error()
    assert len(made) > 10 and {type(e) for e in made} >= {TopicNotFound, errors.InvalidConfig}
    for error in made:
        assert _same(pickle.loads(pickle.dumps(error)), error), error


@pytest.mark.ray
def test_every_error_raised_in_an_actor_reaches_the_caller_as_it_was(ray_address):
    @ray.remote(num_cpus=0)
    def fail(error: ScopecastError) -> None:
        raise error

    for error in _every_error():
        with pytest.raises(ray.exceptions.RayTaskError) as caught:
            ray.get(fail.remote(error))
        cause = typed_cause(caught.value)
        assert cause is not None and _same(cause, error), (error, cause)
    missing = typed_cause(pytest.raises(ray.exceptions.RayTaskError, ray.get,
                                        fail.remote(TopicNotFound("penguins"))).value)
    assert missing.name == "penguins" and str(missing).count("does not exist") == 1
