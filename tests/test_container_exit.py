"""builder/engine/container_exit.py: the exit status by polling, past podman's inspect of a process that
is going (the race is podman's, so a container object stands in for it here)."""

import docker.errors
import pytest

from builder.engine.container_exit import exit_status


class _Going:
    """Answers each reload with the next of `answers`: an error to raise, or the container's state."""

    def __init__(self, *answers) -> None:
        self.answers, self.attrs = list(answers), {}

    def reload(self) -> None:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        self.attrs = {"State": answer}


def _api_error(explanation: str) -> docker.errors.APIError:
    return docker.errors.APIError("500 Server Error", explanation=explanation)


def test_an_inspect_that_meets_the_process_going_is_asked_again():
    going = _Going({"Status": "running"}, _api_error("read /proc/9982/cgroup: no such process"),
                   {"Status": "exited", "ExitCode": 3})
    assert exit_status(going, poll_s=0) == 3
    assert going.answers == []


def test_any_other_api_error_is_raised():
    with pytest.raises(docker.errors.APIError, match="no such container"):
        exit_status(_Going(_api_error("no such container")), poll_s=0)
